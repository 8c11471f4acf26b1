// Checkpointer: the run's checkpoints (torchtitan's CheckpointManager; the trainer owns the
// schedule): the initial weights (--init-from, a model's Hugging Face weights, --save-init),
// --resume, and a save with its pruning (--keep-last).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/trainer/checkpoint_saver.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/framework/trainer/run_directory.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/interfaces.h"
#include "loss_scaling_guard.h"
#include "metrics_processor.h"
#include "reporter.h"

namespace fsdpx {

// What a checkpoint is made of and restored into; every reference outlives the Checkpointer.
struct CheckpointParts {
  ShardingEngine& engine;
  Model& model;
  Optimizer& optimizer;
  DataSource& data;
  LossScalingGuard& scaling;
  MetricsProcessor& metrics;                     // each save's stall and write time
  std::shared_ptr<const DeviceRuntime> device;  // where the state lives
};

class Checkpointer {
 public:
  // `backend`: null when the run has no checkpoint component (save and restore then have nothing
  // to do; the checks before the run refuse the flags that need one). `config_ini`: what
  // config.ini records, saved with every checkpoint. A backend with streamed saves
  // (StreamedCheckpointBackend) saves through a CheckpointSaver: staged into its pool, and in the
  // background when the backend says so (then every rank creates the writers' group here).
  Checkpointer(std::shared_ptr<CheckpointBackend> backend, const TrainSettings& settings, std::string config_ini,
               const ProcessGroups& groups, RunDirectory& run_dir, Reporter& out, CheckpointParts parts);

  bool enabled() const { return backend_ != nullptr; }
  // --init-from, or a model's Hugging Face weights (--model.from_hf), replace the seeded
  // initialisation (a checkpoint to resume from replaces both); --save-init writes what the run
  // starts from. Collective.
  void initial_weights();
  // --resume: the named checkpoint, or the newest under OUT/checkpoints. Returns the step to
  // start from (0 without one). Collective.
  int64_t restore();
  // A checkpoint of step `step` under OUT/checkpoints, then --keep-last's pruning once it is
  // complete. Collective. In the background it returns once the state is staged (after waiting
  // for the save before, which it reports), or on the CPU once its staging has begun (settle()).
  void save(int64_t step);
  // At a step's end: reports a background save that finished; throws (one line naming the
  // checkpoint) when it failed. Local: each rank sees its own writer.
  void poll();
  // Before anything writes the state a save took (the optimizer's next step): waits for its
  // staging, which a background save on the CPU does on a thread of its own while the next step's
  // forward and backward run. Every rank at the same point (collective when a save staged).
  void settle();
  // The run's end: waits for the save in flight and reports it.
  void finish();
  const std::string& last_saved() const { return last_saved_; }  // "" before the first save

 private:
  TrainerState trainer_state(int64_t step) const;
  // The model's names of its parameters in other trainers' checkpoints (fsdpx/checkpoint_names.h).
  OtherNames other_names() const;
  // --resume from a folder PyTorch's DCP wrote, at its optimizer's `step`: checked and said.
  int64_t resumed_from_dcp(const std::string& dir, int64_t step);
  void report(const SaveFigures& f);

  std::shared_ptr<CheckpointBackend> backend_;
  const TrainSettings& s_;
  const std::string config_ini_;
  const ProcessGroups& groups_;
  RunDirectory& run_dir_;
  Reporter& out_;
  CheckpointParts parts_;
  const bool writer_;
  std::string last_saved_;
  std::unique_ptr<CheckpointSaver> saver_;  // null: the backend's plain save()
};

}  // namespace fsdpx
