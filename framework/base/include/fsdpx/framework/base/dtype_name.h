// The short names of dtypes that fsdpx prints: in the plan, the run's lines and collective records.
#pragma once

#include <string>

#include <c10/core/ScalarType.h>

#include "fsdpx/export.h"

namespace fsdpx {

// "fp32", "bf16", "fp16", "fp64", "int64", "int32", "uint8"; LibTorch's name for any other.
FSDPX_API std::string dtype_name(c10::ScalarType t);

}  // namespace fsdpx
