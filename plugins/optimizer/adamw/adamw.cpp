// adamw: Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW:
//   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// State per parameter shard: exp_avg and exp_avg_sq (fp32, like the shard: 8 bytes/parameter)
// and step. One step is ATen's fused AdamW kernel over every shard at once (at::_fused_adamw_,
// the kernel behind torch.optim.AdamW(fused=True), on the CPU and CUDA): one pass over memory
// instead of a chain of tensor ops, each of which reads and writes every element.
#include <map>

#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros_like.h>

#include <fsdpx/error.h>
#include <fsdpx/optimizer.h>
#include <fsdpx/plugin.h>

namespace {

struct State {
  at::Tensor exp_avg, exp_avg_sq;
  int64_t step = 0;
  at::Tensor step_t;  // `step` as the fused kernel reads it (a float scalar)
};

class AdamW final : public fsdpx::Optimizer {
 public:
  AdamW(double lr, double b1, double b2, double eps, double wd) : lr_(lr), b1_(b1), b2_(b2), eps_(eps), wd_(wd) {}

  void init(std::vector<fsdpx::ParamShard> params) override {
    params_ = std::move(params);
    for (auto& p : params_) {
      if (!p.param.requires_grad()) continue;
      State& s = state_[p.name];
      s.exp_avg = at::zeros_like(p.param, at::MemoryFormat::Contiguous);
      s.exp_avg_sq = at::zeros_like(p.param, at::MemoryFormat::Contiguous);
      s.step_t = at::full({}, 0.0, p.param.options().dtype(at::kFloat).requires_grad(false));
    }
  }

  void step(double lr) override { step_shards(lr, 0, params_.size()); }
  bool can_step_shards() const override { return true; }
  // One fused call over the range. Elementwise, so a range gets the bits that the whole step
  // gives it.
  void step_shards(double lr, size_t first, size_t count) override {
    fsdpx::check_shard_range("adamw", first, count, params_.size());
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    for (size_t i = first; i < first + count; ++i) {
      auto& p = params_[i];
      if (!p.param.requires_grad() || !p.param.grad().defined()) continue;
      State& s = state_.at(p.name);
      s.step += 1;
      s.step_t.fill_(static_cast<double>(s.step));
      params.push_back(p.param);
      grads.push_back(p.param.grad());
      exp_avgs.push_back(s.exp_avg);
      exp_avg_sqs.push_back(s.exp_avg_sq);
      steps.push_back(s.step_t);
    }
    if (params.empty()) return;
    bool widen = false;  // gradient shards kept in a lower dtype (bf16_mixed's keep_low_precision_grads)
    for (size_t i = 0; i < params.size(); ++i) widen = widen || grads[i].scalar_type() != params[i].scalar_type();
    if (!widen) {
      at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, b1_, b2_, wd_, eps_,
                        /*amsgrad=*/false, /*maximize=*/false);
      return;
    }
    // The kernel takes gradients in the parameter's dtype: each widened, one shard at a time, so
    // that the step holds one widened copy at most (the same bits: the update is elementwise).
    for (size_t i = 0; i < params.size(); ++i)
      at::_fused_adamw_({params[i]}, {grads[i].to(params[i].scalar_type())}, {exp_avgs[i]}, {exp_avg_sqs[i]},
                        /*max_exp_avg_sqs=*/{}, {steps[i]}, lr, b1_, b2_, wd_, eps_, /*amsgrad=*/false,
                        /*maximize=*/false);
  }

  double base_lr() const override { return lr_; }

  fsdpx::ShardState state(const std::string& name) const override {
    auto it = state_.find(name);
    if (it == state_.end()) throw fsdpx::Error("adamw has no state for parameter '" + name + "'");
    return {{"exp_avg", it->second.exp_avg},
            {"exp_avg_sq", it->second.exp_avg_sq},
            {"step", at::scalar_tensor(static_cast<double>(it->second.step), at::kDouble)}};
  }

  void load_state(const std::string& name, const fsdpx::ShardState& st) override {
    auto it = state_.find(name);
    if (it == state_.end()) throw fsdpx::Error("adamw has no parameter '" + name + "' to load state into");
    for (const auto& [key, t] : st) {
      if (key == "exp_avg") it->second.exp_avg.copy_(t);
      else if (key == "exp_avg_sq") it->second.exp_avg_sq.copy_(t);
      else if (key == "step") it->second.step = static_cast<int64_t>(t.item<double>());
      else throw fsdpx::Error("adamw: unknown state '" + key + "' for parameter '" + name + "'");
    }
  }

 private:
  double lr_, b1_, b2_, eps_, wd_;
  std::vector<fsdpx::ParamShard> params_;
  std::map<std::string, State> state_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::Optimizer>(
      "adamw", "Adam with decoupled weight decay (torch.optim.AdamW); fp32 moments",
      {fsdpx::float_option("lr", 1e-3, fsdpx::FloatRange::above(0), "peak learning rate"),
       fsdpx::list_option("betas", "0.9,0.999", "coefficients of the moving averages of the gradient and its square"),
       fsdpx::float_option("eps", 1e-8, fsdpx::FloatRange::above(0), "added to the denominator"),
       fsdpx::float_option("weight_decay", 1e-2, fsdpx::FloatRange::at_least(0), "decoupled weight decay")},
      [](const fsdpx::ComponentContext& ctx) {
        const auto& o = ctx.options;  // lr, eps, weight_decay within their declared ranges
        auto [b1, b2] = fsdpx::adam_betas(o);
        return std::make_shared<AdamW>(o.get_float("lr"), b1, b2, o.get_float("eps"), o.get_float("weight_decay"));
      });
}

}  // namespace

FSDPX_PLUGIN("optimizer_adamw", "0.1.0", register_components)
