// sgd: stochastic gradient descent as torch.optim.SGD: coupled weight decay (g += wd p),
// momentum with dampening (b = mu b + (1 - dampening) g, the first step b = g), Nesterov
// (g + mu b), then p -= lr * update. State per parameter shard when mu > 0: momentum_buffer and
// initialised (0 until the first step sets b = g), both from init(), so that a checkpoint taken
// or loaded before any step holds them. One step is ATen's fused SGD kernel over every shard at
// once (at::_fused_sgd_, torch.optim.SGD(fused=True)'s, on the CPU and CUDA).
#include <map>
#include <vector>

#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros_like.h>

#include <fsdpx/error.h>
#include <fsdpx/optimizer.h>
#include <fsdpx/plugin.h>

namespace {

class Sgd final : public fsdpx::Optimizer {
 public:
  Sgd(double lr, double momentum, double dampening, double wd, bool nesterov)
      : lr_(lr), mu_(momentum), damp_(dampening), wd_(wd), nesterov_(nesterov) {}

  void init(std::vector<fsdpx::ParamShard> params) override {
    params_ = std::move(params);
    if (mu_ != 0)
      for (const auto& p : params_)
        if (p.param.requires_grad())
          buffers_[p.name] = Buffer{at::zeros_like(p.param, at::MemoryFormat::Contiguous), false};
  }

  void step(double lr) override { step_shards(lr, 0, params_.size()); }
  bool can_step_shards() const override { return true; }
  // Elementwise, so a range gets the bits that the whole step gives it.
  void step_shards(double lr, size_t first, size_t count) override {
    fsdpx::check_shard_range("sgd", first, count, params_.size());
    at::NoGradGuard no_grad;
    // Shards whose momentum buffer starts this step (b = g), and the others: one fused call each.
    std::vector<at::Tensor> params[2], grads[2], bufs[2];
    for (size_t i = first; i < first + count; ++i) {
      auto& p = params_[i];
      if (!p.param.requires_grad() || !p.param.grad().defined()) continue;
      int starts = 0;  // 1: its momentum buffer starts this step
      if (mu_ != 0) {
        Buffer& b = buffers_.at(p.name);
        starts = b.initialised ? 0 : 1;
        bufs[starts].push_back(b.buf);
        b.initialised = true;
      }
      params[starts].push_back(p.param);
      grads[starts].push_back(p.param.grad());
    }
    for (int starts = 0; starts < 2; ++starts) {
      if (params[starts].empty()) continue;
      bool widen = false;  // gradient shards kept in a lower dtype (bf16_mixed's keep_low_precision_grads)
      for (size_t i = 0; i < params[starts].size(); ++i)
        widen = widen || grads[starts][i].scalar_type() != params[starts][i].scalar_type();
      if (!widen) {
        at::_fused_sgd_(params[starts], grads[starts], bufs[starts], wd_, mu_, lr, damp_, nesterov_,
                        /*maximize=*/false, /*is_first_step=*/starts == 1);
        continue;
      }
      // The kernel takes gradients in the parameter's dtype: each widened, one shard at a time.
      for (size_t i = 0; i < params[starts].size(); ++i) {
        std::vector<at::Tensor> buf;
        if (!bufs[starts].empty()) buf.push_back(bufs[starts][i]);
        at::_fused_sgd_({params[starts][i]}, {grads[starts][i].to(params[starts][i].scalar_type())}, buf, wd_, mu_,
                        lr, damp_, nesterov_, /*maximize=*/false, /*is_first_step=*/starts == 1);
      }
    }
  }

  double base_lr() const override { return lr_; }

  fsdpx::ShardState state(const std::string& name) const override {
    auto it = buffers_.find(name);
    if (it == buffers_.end()) return {};
    return {{"momentum_buffer", it->second.buf},
            {"initialised", at::scalar_tensor(it->second.initialised ? 1.0 : 0.0, at::kDouble)}};
  }

  void load_state(const std::string& name, const fsdpx::ShardState& st) override {
    for (const auto& [key, t] : st) {
      if (key == "momentum_buffer") buffers_[name].buf = t.clone();
      else if (key == "initialised") buffers_[name].initialised = t.item<double>() != 0;
      else throw fsdpx::Error("sgd: unknown state '" + key + "' for parameter '" + name + "'");
    }
  }

 private:
  double lr_, mu_, damp_, wd_;
  bool nesterov_;
  std::vector<fsdpx::ParamShard> params_;
  struct Buffer {
    at::Tensor buf;
    bool initialised = false;
  };
  std::map<std::string, Buffer> buffers_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::Optimizer>(
      "sgd", "stochastic gradient descent with momentum, Nesterov and weight decay (torch.optim.SGD)",
      {fsdpx::float_option("lr", 1e-2, fsdpx::FloatRange::above(0), "peak learning rate"),
       fsdpx::float_option("momentum", 0.0, fsdpx::FloatRange::at_least(0), "momentum factor"),
       fsdpx::float_option("dampening", 0.0, fsdpx::FloatRange::closed(0, 1), "dampening of the momentum"),
       fsdpx::float_option("weight_decay", 0.0, fsdpx::FloatRange::at_least(0), "L2 penalty added to the gradient"),
       fsdpx::flag_option("nesterov", false, "Nesterov momentum (needs momentum > 0 and no dampening)")},
      [](const fsdpx::ComponentContext& ctx) {
        const auto& o = ctx.options;
        const double lr = o.get_float("lr"), mu = o.get_float("momentum"), damp = o.get_float("dampening"),
                     wd = o.get_float("weight_decay");
        if (o.get_bool("nesterov") && (mu <= 0 || damp != 0))
          throw fsdpx::Error("nesterov needs momentum > 0 and dampening 0");
        return std::make_shared<Sgd>(lr, mu, damp, wd, o.get_bool("nesterov"));
      });
}

}  // namespace

FSDPX_PLUGIN("optimizer_sgd", "0.1.0", register_components)
