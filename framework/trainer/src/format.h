// How the trainer writes numbers for people: bytes, counts, durations (dtypes:
// fsdpx/framework/base/dtype_name.h).
#pragma once

#include <string>

#include "fsdpx/framework/base/dtype_name.h"

namespace fsdpx {

std::string human_bytes(double bytes);     // "272.62 KiB"
std::string human_count(double n);         // "139.6k", "1.20B"
std::string duration_text(double seconds); // "0:31", "1:02:03"; "?" when unknown

}  // namespace fsdpx
