// bf16_matmul_rows for CPUs with AVX2 and FMA (kernel_body.inc); compiled with -mavx2 -mfma.
#include <cstdint>

namespace fsdpx::bf16_matmul_avx2 {
#include "kernel_body.inc"
}  // namespace fsdpx::bf16_matmul_avx2
