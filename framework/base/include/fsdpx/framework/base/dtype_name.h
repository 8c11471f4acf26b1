// How fsdpx prints a dtype and a shape: in the plan, the run's lines, collective records and
// checkpoint messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "fsdpx/export.h"

namespace fsdpx {

// "fp32", "bf16", "fp16", "fp64", "int64", "int32", "uint8"; LibTorch's name for any other.
FSDPX_API std::string dtype_name(c10::ScalarType t);

// "[2, 3]"; "[]" for a scalar.
FSDPX_API std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace fsdpx
