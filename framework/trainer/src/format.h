// How the trainer writes numbers for people: bytes, counts, durations, dtypes.
#pragma once

#include <string>

#include <c10/core/ScalarType.h>

namespace fsdpx {

std::string human_bytes(double bytes);     // "272.62 KiB"
std::string human_count(double n);         // "139.6k", "1.20B"
std::string duration_text(double seconds); // "0:31", "1:02:03"; "?" when unknown
std::string dtype_name(c10::ScalarType t); // "fp32", "bf16", ...

}  // namespace fsdpx
