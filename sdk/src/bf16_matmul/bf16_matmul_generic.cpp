// bf16_matmul_rows for any CPU (kernel_body.inc), compiled with the library's own flags.
#include <cstdint>

namespace fsdpx::bf16_matmul_generic {
#include "kernel_body.inc"
}  // namespace fsdpx::bf16_matmul_generic
