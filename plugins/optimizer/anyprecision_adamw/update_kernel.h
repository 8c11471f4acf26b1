// One AnyPrecisionAdamW step over contiguous CPU tensors in a single pass over memory.
//
// The tensor-op form of the update reads and writes every element about a dozen times (each op a
// pass, intermediates in the state dtypes). Here the elements go in blocks small enough for L1:
// each operand's block is widened to the compute type (float; double when any operand is fp64),
// updated, and narrowed back once. Blocks run in parallel over the intra-op threads.
#pragma once

#include <ATen/core/Tensor.h>

namespace fsdpx_anyprecision {

struct StepConstants {
  double decay;       // 1 - lr * weight_decay
  double b1, b2, eps;
  double step_size;   // lr / (1 - b1^t)
  double bc2_sqrt;    // sqrt(1 - b2^t)
};

// True when update_in_place can run on these tensors: CPU, contiguous, same length, dtypes among
// fp32, bf16, fp16, fp64. `compensation` is undefined without Kahan summation.
bool fused_update_applies(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_sq, const at::Tensor& compensation);

// Per element, in the compute type, with one rounding into each tensor's dtype at the end:
//   p *= decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   u = step_size * m / (sqrt(v) * (1 / bc2_sqrt) + eps)
//   without Kahan: p -= u
//   with Kahan:    c -= u;  p' = round(p + c);  c += p - p';  p = p'
void update_in_place(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                     const at::Tensor& exp_avg_sq, const at::Tensor& compensation, const StepConstants& k);

}  // namespace fsdpx_anyprecision
