#include "fsdpx/framework/base/dtype_name.h"

namespace fsdpx {

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "fp32";
    case c10::kBFloat16: return "bf16";
    case c10::kHalf: return "fp16";
    case c10::kDouble: return "fp64";
    case c10::kLong: return "int64";
    case c10::kInt: return "int32";
    case c10::kByte: return "uint8";
    default: return c10::toString(t);
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace fsdpx
