// TrainerState: what a checkpoint records of the trainer besides tensors (trainer_state.json),
// written and read here alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fsdpx {

struct TrainerState {
  // The loss scaler's state (fsdpx/loss_scaling.h), and the steps it skipped so far.
  struct LossScaling {
    std::string state;  // LossScaler::state(), JSON text
    int64_t skipped_steps = 0;
  };

  int64_t step = 0;
  uint64_t seed = 0;                      // the run's --seed
  std::string data;                       // DataSource::state(), JSON text; kNoDataPosition: none
  // What a checkpoint saved from fsdpx::fully_shard (the user's own loop, no fsdpx data source)
  // holds as its data position: resuming it, fsdpx-train starts its data from the beginning.
  static constexpr const char* kNoDataPosition = "{}";
  bool has_data_position() const { return data != kNoDataPosition; }
  std::optional<std::string> hf_config;   // HuggingFaceModel::hf_config_json(), when the model has one
  std::optional<LossScaling> loss_scaler; // when the precision policy scales the loss

  // {"data", "hf_config", "loss_scaler": {"skipped_steps", "state"}, "seed", "step"}.
  std::string to_json() const;
  // The inverse of to_json. Throws fsdpx::Error ("checkpoint: ...") for a checkpoint without a
  // trainer state (it cannot resume a run) or with one that trainer_state_problem
  // (fsdpx/framework/checkpoint/checkpointing.h) refuses.
  static TrainerState from_json(const std::string& text);
};

}  // namespace fsdpx
