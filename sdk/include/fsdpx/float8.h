// fsdpx/float8.h: linear layers computed in float8, with torchao's numerics (its default
// "tensorwise" recipe, torchao.float8.convert_to_float8_training), for model plugins.
//
// A model writes its linears with fsdpx::linear (fsdpx/linear.h). Where the precision policy asks
// for float8 in a unit (`--precision.name float8`), the engine turns float8 on for that unit's forward
// and its recompute (Float8Scope), and fsdpx::linear then computes each weight float8_eligible()
// accepts with fsdpx::float8_linear:
//   forward        y  = x W^T   x and W in e4m3
//   input grad     gx = g W     g (the output gradient) in e5m2, W in e4m3
//   weight grad    gW = g^T x   g in e5m2, x in e4m3
// each cast with one dynamic scale for the whole tensor, scale = max(dtype) / max(|t|, 1e-12)
// (worked out in float64, then rounded to float32), saturated to the dtype's range, and each
// product through at::_scaled_mm with the scales' reciprocals, out in x's dtype (bf16 or fp32).
// The operands, their layouts and the scales are torchao's, so on one device the results are
// torchao's to the bit. The saved tensors are x and W in high precision, as torchao's.
//
// A layer that must stay in the compute dtype whatever the policy calls fsdpx::output_linear: a
// model's output projection (torchtitan's float8 filter leaves `output` out by default; the logits
// feed the loss directly).
//
//   at::Tensor h = fsdpx::linear(x, wq);              // float8 in a float8 unit
//   at::Tensor logits = fsdpx::output_linear(h, head); // never float8
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdpx/export.h"

namespace fsdpx {

// The largest finite values of the two float8 formats: e4m3 (inputs and weights) and e5m2
// (output gradients, which need the range more than the precision).
constexpr double kFloat8E4m3Max = 448.0;
constexpr double kFloat8E5m2Max = 57344.0;

// Float8 on (or off) for fsdpx::linear on this thread until the scope ends; scopes nest.
class FSDPX_API Float8Scope {
 public:
  explicit Float8Scope(bool on);
  ~Float8Scope();
  Float8Scope(const Float8Scope&) = delete;
  Float8Scope& operator=(const Float8Scope&) = delete;

 private:
  bool previous_;
};

// Whether fsdpx::linear computes in float8 on this thread now.
FSDPX_API bool float8_on();

// Whether a linear of this weight computes in float8 when float8 is on: a 2-D floating weight
// whose two sizes are multiples of 16, as at::_scaled_mm needs on CUDA (torchtitan's filter;
// the same on every device, so that a run's numerics do not depend on where it runs).
FSDPX_API bool float8_eligible(const at::Tensor& weight);
// The same for a floating weight of `shape` (planners, which have shapes only).
FSDPX_API bool float8_eligible_shape(const std::vector<int64_t>& shape);

// The scale of a tensorwise cast of `t` to `float8` (at::kFloat8_e4m3fn or at::kFloat8_e5m2): a
// 0-dim float32 tensor, max(float8) / max(amax(|t|), 1e-12) as torchao works it out.
FSDPX_API at::Tensor float8_scale(const at::Tensor& t, c10::ScalarType float8);

// t * scale in float32, saturated to the float8 range, rounded to `float8`; t's layout kept.
FSDPX_API at::Tensor to_float8(const at::Tensor& t, const at::Tensor& scale, c10::ScalarType float8);

// y = x W^T in float8 (above), whatever float8_on() says. x [..., in], weight [out, in].
FSDPX_API at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight);

// The scales of tensorwise e4m3 casts of weights from their amaxes (a float32 tensor, one per
// weight), as torchao's precompute_float8_dynamic_scale_for_fsdp: the floor applied in float32,
// then max / amax in float64, rounded to float32. The same as float8_scale but where amax < 1e-12.
FSDPX_API at::Tensor float8_weight_scales(const at::Tensor& amaxes);

// float8 all-gather (the engine's, `--precision.float8_all_gather`): a weight its unit gathers in
// e4m3, cast on each rank's shard before the all-gather, instead of in the compute dtype. While
// registered, fsdpx::linear in a float8 scope computes with `data` and `scale` (torchao's
// Float8TrainingTensor after FSDP2's all-gather: the same products, the weight never cast again)
// and reads nothing of the weight's own tensor, which holds no data inside the step; only its
// gradient is the weight's. The engine fills `data` while the unit is gathered and sets `scale`
// before each forward, between steps only.
struct Float8GatheredWeight {
  at::Tensor data;  // e4m3 [out, in]
  at::Tensor scale;  // 0-dim float32
};
// Registers `weight` (by identity, as the module holds it) until the returned handle goes.
FSDPX_API std::shared_ptr<void> register_float8_gathered(const at::Tensor& weight,
                                                         std::shared_ptr<const Float8GatheredWeight> gathered);

// How many float8 linear forwards this process has computed (the engine's check that a float8
// policy reached a linear).
FSDPX_API uint64_t float8_linears_computed();

// y = x W^T in the compute dtype, whatever float8_on() says (fsdpx::linear with float8 off).
FSDPX_API at::Tensor output_linear(const at::Tensor& x, const at::Tensor& weight);

}  // namespace fsdpx
