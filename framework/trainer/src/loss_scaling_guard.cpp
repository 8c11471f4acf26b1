#include "loss_scaling_guard.h"

#include <cstdio>
#include <limits>

#include <ATen/ops/isfinite.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/framework/base/fault_injection.h"
#include "fsdpx/framework/runtime/every_rank.h"

namespace fsdpx {

LossScalingGuard::LossScalingGuard(std::unique_ptr<LossScaler> scaler, Communicator& world,
                                   std::function<void(const std::string&)> report)
    : scaler_(std::move(scaler)), world_(world), report_(std::move(report)) {}

void LossScalingGuard::begin_step() { step_scale_ = scaler_ ? scaler_->scale() : 1.0; }

at::Tensor LossScalingGuard::scaled(const at::Tensor& loss) const { return scaler_ ? loss * step_scale_ : loss; }

double LossScalingGuard::scale() const { return scaler_ ? scaler_->scale() : 1.0; }

bool LossScalingGuard::unscale_and_check(const std::vector<ParamShard>& shards, int64_t step) {
  if (!scaler_) return false;
  at::NoGradGuard no_grad;
  inject_inf_fault(shards, step);
  bool bad = false;
  for (const auto& p : shards) {
    at::Tensor g = p.param.grad();
    if (!g.defined()) continue;
    g.mul_(1.0 / step_scale_);
    bad = bad || !at::isfinite(g).all().item<bool>();
  }
  const auto all = from_every_rank(world_, std::vector<double>{bad ? 1.0 : 0.0});
  std::string ranks;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r][0] > 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  scaler_->update(!ranks.empty());
  if (ranks.empty()) return false;
  ++skipped_;
  if (world_.rank() == 0) {
    char l[200];
    std::snprintf(l, sizeof l,
                  "step %ld: inf/NaN in the gradients of rank(s) %s: skipped on every rank; loss scale %g -> %g",
                  static_cast<long>(step + 1), ranks.c_str(), step_scale_, scaler_->scale());
    report_(l);
  }
  return true;
}

// FSDPX_FAULT=inf-grad:R:STEP (fsdpx/framework/base/fault_injection.h): rank R finds an inf in
// its first gradient shard at step STEP (from 1).
void LossScalingGuard::inject_inf_fault(const std::vector<ParamShard>& shards, int64_t step) const {
  if (shards.empty() || !shards.front().param.grad().defined()) return;
  if (!fault_requested("inf-grad", world_.rank(), std::to_string(step + 1))) return;
  shards.front().param.grad().view(-1)[0].fill_(std::numeric_limits<double>::infinity());
}

TrainerState::LossScaling LossScalingGuard::state() const { return {scaler_->state(), skipped_}; }

void LossScalingGuard::restore(const TrainerState::LossScaling& state) {
  if (!scaler_) return;  // a run without loss scaling leaves a checkpoint's scaler aside
  scaler_->load_state(state.state);
  skipped_ = state.skipped_steps;
}

}  // namespace fsdpx
