// LossScalingGuard: loss scaling around a step (fsdpx/loss_scaling.h), for a precision policy
// that asks for it; without a scaler every call is a no-op.
//
//   begin_step        reads the scale this step uses
//   scaled            the loss times the scale, for backward
//   unscale_and_check divides every gradient shard by the scale and looks for inf/NaN; one small
//                     all-gather tells every rank which ranks found one, so that every rank skips
//                     the step alike; the scaler learns the outcome
//   state / restore   the scaler's state in the trainer state of checkpoints
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/loss_scaling.h"
#include "fsdpx/optimizer.h"
#include "trainer_state.h"

namespace fsdpx {

class LossScalingGuard {
 public:
  // `scaler`: null when the precision policy scales nothing. `report` gets the line of a skipped
  // step, on rank 0 only. `world` outlives the guard.
  LossScalingGuard(std::unique_ptr<LossScaler> scaler, Communicator& world,
                   std::function<void(const std::string&)> report);

  bool active() const { return scaler_ != nullptr; }
  void begin_step();
  at::Tensor scaled(const at::Tensor& loss) const;
  // Returns whether step `step` (from 0) is skipped, the same on every rank. Collective.
  bool unscale_and_check(const std::vector<ParamShard>& shards, int64_t step);

  double scale() const;  // for the next step
  int64_t skipped_steps() const { return skipped_; }
  TrainerState::LossScaling state() const;
  void restore(const TrainerState::LossScaling& state);

 private:
  void inject_inf_fault(const std::vector<ParamShard>& shards, int64_t step) const;

  std::unique_ptr<LossScaler> scaler_;
  Communicator& world_;
  std::function<void(const std::string&)> report_;
  double step_scale_ = 1.0;
  int64_t skipped_ = 0;
};

}  // namespace fsdpx
