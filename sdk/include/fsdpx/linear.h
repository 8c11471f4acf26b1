// fsdpx/linear.h: a linear layer without bias, y = x W^T, for model plugins. Its values and
// gradients are at::linear's to the last bit, on every device and in every dtype; only the time
// of one product differs where that is safe to prove.
//
// On a CPU without native bf16, LibTorch's bf16 product for a row-major right-hand operand is a
// scalar reference loop (about 1.4 GFLOP/s on one core), and a linear layer's input gradient
// g @ W is that product. fsdpx::linear computes that gradient with a blocked, vectorised kernel
// that adds in the reference loop's order, so its bits are the same. It does so only where a
// check has shown, in this process, that at::mm gives those bits: a product of values chosen so
// that any other order of addition shows, once per process, then at::mm's own result on the
// first call of each shape. Anywhere else (fp32, another device, a CPU whose LibTorch takes
// oneDNN's path, a shape whose check failed) it is at::linear.
//
// In a unit the precision policy computes in float8, it is fsdpx::float8_linear instead, for
// the weights fsdpx/float8.h says.
//
//   at::Tensor y = fsdpx::linear(x, weight);  // x [..., in], weight [out, in]
#pragma once

#include <ATen/core/Tensor.h>

#include "fsdpx/export.h"

namespace fsdpx {

FSDPX_API at::Tensor linear(const at::Tensor& x, const at::Tensor& weight);

// Whether this process has computed a bf16 input gradient with fsdpx's kernel: false before
// the first bf16 backward on the CPU, and where every shape's check failed.
FSDPX_API bool linear_uses_bf16_kernel();

// c = a @ b for 2-D row-major bf16 CPU tensors, in the order of LibTorch's reference loop
// (fsdpx/linear.h's kernel), whatever this CPU's at::mm does. For tests and benchmarks.
FSDPX_API at::Tensor bf16_matmul_reference_order(const at::Tensor& a, const at::Tensor& b);

}  // namespace fsdpx
