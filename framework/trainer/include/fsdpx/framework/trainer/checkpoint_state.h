// The trainer's side of checkpoints: what a rank saves, the collective context the formats use,
// and what a load hands back to the optimizer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/export.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/optimizer.h"

namespace fsdpx {

class CheckpointSaver;
class Communicator;
class DeviceRuntime;
class ShardingEngine;
class ProcessGroups;

// Every tensor this rank holds: each parameter's real rows (padding left out) under its own name,
// and the optimizer's state under "optim/<param>/<key>" (per-row state sharded like the
// parameter, scalars replicated). The locals of parameters are views of the engine's shards, so
// a load writes them in place. For a load (`for_load`), optimizer state is copied, filled and
// handed back by load_optimizer_state; for a save it is the optimizer's own tensors, not copied.
FSDPX_API CheckpointState checkpoint_state(const ShardingEngine& engine, const Optimizer& optimizer, bool for_load);
// The parameters alone (the first part of checkpoint_state): views of the engine's shards, for
// --init-from (loaded in place) and --save-init.
FSDPX_API CheckpointState weights_state(const ShardingEngine& engine);
// Host staging: checkpoint formats read and write host memory only (a device tensor's data_ptr is
// not the host's). Each tensor of `st` not on the CPU is replaced by a host copy of it; after a
// load, copy_back() puts the loaded values into the device tensors (the engine's shards). A
// state on the CPU is left as it is.
struct FSDPX_API HostStaging {
  std::vector<std::pair<at::Tensor, at::Tensor>> device_and_host;
  void copy_back() const;
};
FSDPX_API HostStaging stage_on_host(CheckpointState& st);
// A context over the ranks (the control group, on the CPU): barrier, all_sum, gather_to_rank0,
// and primary = first replica.
FSDPX_API CheckpointContext checkpoint_context(const ProcessGroups& groups, const ShardingEngine& engine);
// The same over `group` (every rank, Gloo on CPU tensors): a background writer's own
// (ProcessGroups::new_control_group).
FSDPX_API CheckpointContext checkpoint_context(std::shared_ptr<Communicator> group, const ShardingEngine& engine);
// The saver of a streamed backend's saves (checkpoint_saver.h), as fsdpx-train and the library
// make it: over `groups`' control group, and for a backend that saves in the background, a
// control group of its own (new_control_group) for the writer thread. Collective then.
FSDPX_API std::unique_ptr<CheckpointSaver> make_checkpoint_saver(StreamedCheckpointBackend& backend,
                                                                 const ProcessGroups& groups,
                                                                 const ShardingEngine& engine,
                                                                 std::shared_ptr<const DeviceRuntime> device);
// Each of `shards` whole on every rank of `world` (CPU tensors over Gloo): one exchange of every
// rank's rows, then one all-gather per tensor. Collective.
FSDPX_API std::vector<at::Tensor> gather_whole(Communicator& world, const std::vector<TensorShard>& shards);
// Loads the checkpoint `dir` into `st` with `load` (a backend's load, or load_initial_weights).
// A folder PyTorch's DCP wrote is read under the names it holds the run's tensors under
// (dcp_names, with a model's `other_names`, which may be empty), and since DCP records no step,
// st.step is then its optimizer's: the one value every optim/<p>/step holds (0 without any).
// Returns whether `dir` is such a folder. Throws fsdpx::Error when its parameters' steps differ.
FSDPX_API bool load_checkpoint(const std::string& dir, CheckpointState& st,
                               const std::function<void(CheckpointState&)>& load,
                               const OtherNames& other_names);
// After a load: the optimizer state into the optimizer. (The trainer state, with the data
// position, is the trainer's TrainerState.)
FSDPX_API void load_optimizer_state(const CheckpointState& state, Optimizer& optimizer);

}  // namespace fsdpx
