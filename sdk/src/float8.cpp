#include "fsdpx/float8.h"

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ops/_scaled_mm.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/maximum.h>
#include <torch/csrc/autograd/custom_function.h>

#include "fsdpx/error.h"
#include "fsdpx/linear.h"

namespace fsdpx {
namespace {

thread_local bool float8_now = false;
std::atomic<uint64_t> float8_forwards{0};

// torchao's EPS: an all-zero tensor gets a large finite scale, not an infinite one.
constexpr double kAmaxFloor = 1e-12;

double float8_max(c10::ScalarType float8) {
  if (float8 == at::kFloat8_e4m3fn) return kFloat8E4m3Max;
  if (float8 == at::kFloat8_e5m2) return kFloat8E5m2Max;
  throw Error(std::string("float8: ") + c10::toString(float8) + " is not a float8 format fsdpx casts to; use " +
              "Float8_e4m3fn or Float8_e5m2");
}

bool row_major(const at::Tensor& t) { return t.stride(1) == 1 && t.stride(0) >= t.size(1); }
bool column_major(const at::Tensor& t) { return t.stride(0) == 1 && t.stride(1) >= t.size(0); }

// at::_scaled_mm takes its left operand row-major and its right one column-major: the copies
// torchao makes for each product, the same ones, so that each kernel sees torchao's layout.
at::Tensor scaled_mm(at::Tensor a, const at::Tensor& a_scale, at::Tensor b, const at::Tensor& b_scale,
                     c10::ScalarType out, bool fast_accum) {
  if (!row_major(a)) a = a.contiguous();
  if (!column_major(b)) b = b.t().contiguous().t();
  if (a.is_cuda() && (a.size(0) % 16 || a.size(1) % 16 || b.size(1) % 16))
    throw Error("float8 on CUDA needs every product's sizes multiples of 16, and this one is [" +
                std::to_string(a.size(0)) + ", " + std::to_string(a.size(1)) + "] x [" + std::to_string(b.size(0)) +
                ", " + std::to_string(b.size(1)) + "]: make the tokens per rank (batch x sequence) a multiple of 16");
  try {
    return at::_scaled_mm(a, b, a_scale.reciprocal(), b_scale.reciprocal(), std::nullopt, std::nullopt, out,
                          fast_accum);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw Error("float8: at::_scaled_mm cannot run this product on " + a.device().str() + " (" +
                what.substr(0, what.find('\n')) + "); float8 runs on the CPU and on GPUs of compute capability 8.9 "
                "and later (Ada, Hopper: H100, H200); use --precision bf16_mixed here");
  }
}

// torchao's matmul_with_hp_or_float8_args for a weight in high precision: the forward product
// accumulates fast (its gemm_config_output), the two backward products do not.
struct Float8LinearFunction : torch::autograd::Function<Float8LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    const at::Tensor x_scale = float8_scale(x, at::kFloat8_e4m3fn), w_scale = float8_scale(weight, at::kFloat8_e4m3fn);
    ctx->save_for_backward({x, weight, x_scale, w_scale});
    const at::Tensor x2d = x.reshape({-1, x.size(-1)});
    at::Tensor y = scaled_mm(to_float8(x2d, x_scale, at::kFloat8_e4m3fn), x_scale,
                             to_float8(weight.t(), w_scale, at::kFloat8_e4m3fn), w_scale, x.scalar_type(), true);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = weight.size(0);
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &x_scale = saved[2], &w_scale = saved[3];
    const at::Tensor g2d = grads[0].reshape({-1, weight.size(0)});
    const at::Tensor g_scale = float8_scale(g2d, at::kFloat8_e5m2);
    const at::Tensor g8 = to_float8(g2d, g_scale, at::kFloat8_e5m2);
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0))
      grad_x = scaled_mm(g8, g_scale, to_float8(weight.t(), w_scale, at::kFloat8_e4m3fn).t(), w_scale,
                         grads[0].scalar_type(), false)
                   .view(x.sizes());
    if (ctx->needs_input_grad(1))
      grad_weight = scaled_mm(g8.t(), g_scale, to_float8(x.reshape({-1, x.size(-1)}), x_scale, at::kFloat8_e4m3fn),
                              x_scale, grads[0].scalar_type(), false);
    return {grad_x, grad_weight};
  }
};

// A weight gathered in float8 (float8 all-gather): the weight's data and scale come from the
// all-gather, the product is the same as above. Saved: x and the gathered e4m3 weight, as
// torchao's with a Float8TrainingTensor weight (the gathered bytes' storage is refilled for the
// backward when the unit reshards after forward, as FSDP2's all-gather output is).
struct Float8GatheredLinearFunction : torch::autograd::Function<Float8GatheredLinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& data, const at::Tensor& w_scale) {
    const at::Tensor x_scale = float8_scale(x, at::kFloat8_e4m3fn);
    ctx->save_for_backward({x, data, x_scale, w_scale});
    at::Tensor y = scaled_mm(to_float8(x.reshape({-1, x.size(-1)}), x_scale, at::kFloat8_e4m3fn), x_scale, data.t(),
                             w_scale, x.scalar_type(), true);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = weight.size(0);
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &data = saved[1], &x_scale = saved[2], &w_scale = saved[3];
    const at::Tensor g2d = grads[0].reshape({-1, data.size(0)});
    const at::Tensor g_scale = float8_scale(g2d, at::kFloat8_e5m2);
    const at::Tensor g8 = to_float8(g2d, g_scale, at::kFloat8_e5m2);
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0))
      grad_x = scaled_mm(g8, g_scale, data, w_scale, grads[0].scalar_type(), false).view(x.sizes());
    if (ctx->needs_input_grad(1))
      grad_weight = scaled_mm(g8.t(), g_scale, to_float8(x.reshape({-1, x.size(-1)}), x_scale, at::kFloat8_e4m3fn),
                              x_scale, grads[0].scalar_type(), false);
    return {grad_x, grad_weight, at::Tensor(), at::Tensor()};
  }
};

// The weights gathered in float8, by their module tensor's identity. Read by every float8
// linear's forward (also a recompute on autograd's thread), written when an engine is built or
// goes.
struct GatheredWeights {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, std::shared_ptr<const Float8GatheredWeight>> by_weight;
};

GatheredWeights& gathered_weights() {
  static GatheredWeights* registry = new GatheredWeights();  // never destroyed: handles may outlive statics
  return *registry;
}

std::shared_ptr<const Float8GatheredWeight> gathered_of(const at::Tensor& weight) {
  GatheredWeights& r = gathered_weights();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.by_weight.find(weight.unsafeGetTensorImpl());
  return it == r.by_weight.end() ? nullptr : it->second;
}

}  // namespace

Float8Scope::Float8Scope(bool on) : previous_(float8_now) { float8_now = on; }
Float8Scope::~Float8Scope() { float8_now = previous_; }

bool float8_on() { return float8_now; }

bool float8_eligible(const at::Tensor& weight) {
  return at::isFloatingType(weight.scalar_type()) && float8_eligible_shape(weight.sizes().vec());
}

bool float8_eligible_shape(const std::vector<int64_t>& shape) {
  return shape.size() == 2 && shape[0] % 16 == 0 && shape[1] % 16 == 0 && shape[0] > 0 && shape[1] > 0;
}

at::Tensor float8_scale(const at::Tensor& t, c10::ScalarType float8) {
  const double max = float8_max(float8);
  // max |t| as the larger of -min and max: exact, as torchao's max(abs(t)), without a copy of t.
  const auto [low, high] = at::aminmax(t);
  const at::Tensor amax = at::maximum(low.neg(), high);
  // max / amax as torchao writes it, a Python float over a tensor: reciprocal, then product.
  return amax.to(at::kDouble).clamp_min(kAmaxFloor).reciprocal().mul(max).to(at::kFloat);
}

at::Tensor float8_weight_scales(const at::Tensor& amaxes) {
  return amaxes.clamp_min(kAmaxFloor).to(at::kDouble).reciprocal().mul(kFloat8E4m3Max).to(at::kFloat);
}

std::shared_ptr<void> register_float8_gathered(const at::Tensor& weight,
                                               std::shared_ptr<const Float8GatheredWeight> gathered) {
  const c10::TensorImpl* key = weight.unsafeGetTensorImpl();
  const Float8GatheredWeight* mine = gathered.get();
  {
    GatheredWeights& r = gathered_weights();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.by_weight[key] = std::move(gathered);
  }
  // Erases its own registration only: a later one of the same tensor (another engine over the
  // module) stays.
  return std::shared_ptr<void>(nullptr, [key, mine](void*) {
    GatheredWeights& r = gathered_weights();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.by_weight.find(key);
    if (it != r.by_weight.end() && it->second.get() == mine) r.by_weight.erase(it);
  });
}

at::Tensor to_float8(const at::Tensor& t, const at::Tensor& scale, c10::ScalarType float8) {
  const double max = float8_max(float8);
  // Saturated by hand, as torchao does: LibTorch 2.11's eager cast does not saturate.
  // One float32 copy, scaled and saturated in place: torchao's values, a third of its temporaries.
  at::Tensor scaled = t.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  scaled.mul_(scale).clamp_(-max, max);
  return scaled.to(float8);
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight) {
  if (x.dim() < 2 || !float8_eligible(weight) || x.size(-1) != weight.size(1))
    throw Error("float8_linear: needs x [..., in] and a weight [out, in] with both sizes multiples of 16; got x " +
                c10::str(x.sizes()) + " and weight " + c10::str(weight.sizes()) + " (" +
                c10::toString(weight.scalar_type()) + ")");
  float8_forwards.fetch_add(1, std::memory_order_relaxed);
  // Only while its unit holds the gathered bytes; otherwise the weight's own tensor says what it
  // holds (this rank's rows between steps, or an error naming the parameter inside one).
  if (const auto gathered = gathered_of(weight); gathered && gathered->data.storage().nbytes() > 0)
    return Float8GatheredLinearFunction::apply(x, weight, gathered->data, gathered->scale);
  return Float8LinearFunction::apply(x, weight);
}

uint64_t float8_linears_computed() { return float8_forwards.load(std::memory_order_relaxed); }

at::Tensor output_linear(const at::Tensor& x, const at::Tensor& weight) {
  Float8Scope off(false);
  return fsdpx::linear(x, weight);
}

}  // namespace fsdpx
