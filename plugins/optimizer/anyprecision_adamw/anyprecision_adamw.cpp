// anyprecision_adamw: torchdistx's AnyPrecisionAdamW, on CPU too. Moments and the Kahan
// compensation buffer are kept in chosen dtypes (default: momentum fp32, variance bf16,
// compensation bf16), so pure-bf16 training can keep updates that bf16 rounding would swallow.
// Per step t, for each parameter p with gradient g:
//   p *= 1 - lr * weight_decay                         (decoupled, before the moments)
//   m = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps ;  step = lr / (1 - b1^t)
//   without Kahan: p -= step * m / denom
//   with Kahan:    c -= step * m / denom ; old = p ; p += c ; c += old - p
//                  (the compensated update goes into p; what rounding kept out stays in c)
// On the CPU one step is a single vectorised pass over each shard (update_kernel.h), computing in
// fp32 (fp64 when a tensor is fp64) and rounding into each tensor's dtype once. On a device (and
// for a shard that is not contiguous) it is the same update as tensor ops, one shard at a time:
// each operand widened to the compute type, updated there, and rounded into its dtype once, so
// that a GPU's numerics are the CPU's (within a few ulps of the update where the single pass
// keeps an intermediate unrounded).
#include <cmath>
#include <map>

#include <ATen/ops/zeros_like.h>

#include <fsdpx/error.h>
#include <fsdpx/optimizer.h>
#include <fsdpx/plugin.h>

#include "update_kernel.h"

namespace {

at::ScalarType dtype_of(const std::string& name) {
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  return at::kDouble;  // "fp64"
}

struct State {
  at::Tensor exp_avg, exp_avg_sq, compensation;
  int64_t step = 0;
};

class AnyPrecisionAdamW final : public fsdpx::Optimizer {
 public:
  struct Config {
    double lr, b1, b2, eps, wd;
    bool kahan;
    at::ScalarType momentum, variance, compensation;
  };
  explicit AnyPrecisionAdamW(Config c) : c_(c) {}

  void init(std::vector<fsdpx::ParamShard> params) override {
    params_ = std::move(params);
    for (auto& p : params_) {
      if (!p.param.requires_grad()) continue;
      if (c_.kahan && p.param.scalar_type() == at::kFloat)
        throw fsdpx::Error("use_kahan_summation is for low-precision parameters, but '" + p.name +
                           "' is fp32, where it has no effect but its cost; turn it off, or keep bf16 parameters "
                           "(precision pure_bf16)");
      State& s = state_[p.name];
      s.exp_avg = at::zeros_like(p.param, p.param.options().dtype(c_.momentum));
      s.exp_avg_sq = at::zeros_like(p.param, p.param.options().dtype(c_.variance));
      if (c_.kahan) s.compensation = at::zeros_like(p.param, p.param.options().dtype(c_.compensation));
    }
  }

  void step(double lr) override { step_shards(lr, 0, params_.size()); }
  bool can_step_shards() const override { return true; }
  // Shard by shard in either case, so a range gets the bits that the whole step gives it.
  void step_shards(double lr, size_t first, size_t count) override {
    fsdpx::check_shard_range("anyprecision_adamw", first, count, params_.size());
    at::NoGradGuard no_grad;
    for (size_t i = first; i < first + count; ++i) {
      auto& p = params_[i];
      if (!p.param.requires_grad() || !p.param.grad().defined()) continue;
      State& s = state_.at(p.name);
      s.step += 1;
      const double t = static_cast<double>(s.step);
      const fsdpx_anyprecision::StepConstants k{1.0 - lr * c_.wd, c_.b1, c_.b2, c_.eps,
                                                lr / (1.0 - std::pow(c_.b1, t)), std::sqrt(1.0 - std::pow(c_.b2, t))};
      if (fsdpx_anyprecision::fused_update_applies(p.param, p.param.grad(), s.exp_avg, s.exp_avg_sq, s.compensation))
        fsdpx_anyprecision::update_in_place(p.param, p.param.grad(), s.exp_avg, s.exp_avg_sq, s.compensation, k);
      else
        step_with_tensor_ops(p.param, s, k);
    }
  }

  double base_lr() const override { return c_.lr; }

  fsdpx::ShardState state(const std::string& name) const override {
    auto it = state_.find(name);
    if (it == state_.end()) throw fsdpx::Error("anyprecision_adamw has no state for parameter '" + name + "'");
    fsdpx::ShardState out{{"exp_avg", it->second.exp_avg},
                          {"exp_avg_sq", it->second.exp_avg_sq},
                          {"step", at::scalar_tensor(static_cast<double>(it->second.step), at::kDouble)}};
    if (c_.kahan) out.emplace_back("compensation", it->second.compensation);
    return out;
  }

  void load_state(const std::string& name, const fsdpx::ShardState& st) override {
    auto it = state_.find(name);
    if (it == state_.end()) throw fsdpx::Error("anyprecision_adamw has no parameter '" + name + "' to load state into");
    for (const auto& [key, t] : st) {
      if (key == "exp_avg") it->second.exp_avg.copy_(t);
      else if (key == "exp_avg_sq") it->second.exp_avg_sq.copy_(t);
      else if (key == "compensation" && c_.kahan) it->second.compensation.copy_(t);
      else if (key == "step") it->second.step = static_cast<int64_t>(t.item<double>());
      else throw fsdpx::Error("anyprecision_adamw: unexpected state '" + key + "' for parameter '" + name + "'");
    }
  }

 private:
  // `t` in the compute type: itself when it already is (updated in place), else a widened copy.
  static at::Tensor widened(const at::Tensor& t, at::ScalarType compute) {
    return t.scalar_type() == compute ? t : t.to(compute);
  }
  // `dst` := `computed` rounded into its dtype (nothing when `computed` is `dst` itself).
  static void round_into(const at::Tensor& dst, const at::Tensor& computed) {
    if (!computed.is_same(dst)) dst.copy_(computed);
  }

  void step_with_tensor_ops(at::Tensor& param, State& s, const fsdpx_anyprecision::StepConstants& k) const {
    const bool wide = param.scalar_type() == at::kDouble || s.exp_avg.scalar_type() == at::kDouble ||
                      s.exp_avg_sq.scalar_type() == at::kDouble ||
                      (c_.kahan && s.compensation.scalar_type() == at::kDouble);
    const at::ScalarType compute = wide ? at::kDouble : at::kFloat;
    at::Tensor p = widened(param, compute), g = widened(param.grad(), compute);
    at::Tensor m = widened(s.exp_avg, compute), v = widened(s.exp_avg_sq, compute);
    if (c_.wd != 0) p.mul_(k.decay);
    m.mul_(c_.b1).add_(g, 1.0 - c_.b1);
    v.mul_(c_.b2).add_(g * g, 1.0 - c_.b2);
    at::Tensor u = m.mul(k.step_size).div_(v.sqrt().mul_(1.0 / k.bc2_sqrt).add_(c_.eps));
    round_into(s.exp_avg, m);
    round_into(s.exp_avg_sq, v);
    if (!c_.kahan) {
      round_into(param, p.sub_(u));
      return;
    }
    at::Tensor c = widened(s.compensation, compute).sub_(u);
    at::Tensor old = p.clone();
    round_into(param, p.add_(c));
    c.add_(old.sub_(widened(param, compute)));  // what the parameter's dtype kept of p + c
    round_into(s.compensation, c);
  }

  Config c_;
  std::vector<fsdpx::ParamShard> params_;
  std::map<std::string, State> state_;
};

void register_components(fsdpx::Registrar& r) {
  const std::vector<std::string> dtypes = {"fp32", "bf16", "fp16", "fp64"};
  r.add<fsdpx::Optimizer>(
      "anyprecision_adamw",
      "AdamW with moments and Kahan compensation in chosen dtypes (torchdistx's AnyPrecisionAdamW)",
      {fsdpx::float_option("lr", 1e-3, fsdpx::FloatRange::above(0), "peak learning rate"),
       fsdpx::list_option("betas", "0.9,0.999", "coefficients of the moving averages of the gradient and its square"),
       fsdpx::float_option("eps", 1e-8, fsdpx::FloatRange::above(0), "added to the denominator"),
       fsdpx::float_option("weight_decay", 0.0, fsdpx::FloatRange::at_least(0),
                           "decoupled weight decay, applied before the moment updates"),
       fsdpx::flag_option("use_kahan_summation", false, "compensated updates for bf16 parameters"),
       fsdpx::choice_option("momentum_dtype", "fp32", dtypes, "dtype of the first moment"),
       fsdpx::choice_option("variance_dtype", "bf16", dtypes, "dtype of the second moment"),
       fsdpx::choice_option("compensation_buffer_dtype", "bf16", dtypes, "dtype of the Kahan compensation")},
      [](const fsdpx::ComponentContext& ctx) {
        const auto& o = ctx.options;
        AnyPrecisionAdamW::Config c{};
        c.lr = o.get_float("lr");
        c.eps = o.get_float("eps");
        c.wd = o.get_float("weight_decay");  // lr, eps, weight_decay within their declared ranges
        std::tie(c.b1, c.b2) = fsdpx::adam_betas(o);
        c.kahan = o.get_bool("use_kahan_summation");
        c.momentum = dtype_of(o.get_string("momentum_dtype"));
        c.variance = dtype_of(o.get_string("variance_dtype"));
        c.compensation = dtype_of(o.get_string("compensation_buffer_dtype"));
        return std::make_shared<AnyPrecisionAdamW>(c);
      });
}

}  // namespace

FSDPX_PLUGIN("optimizer_anyprecision_adamw", "0.1.0", register_components)
