// The trainer's side of checkpoints: what a rank saves, the collective context the formats use,
// and what a load hands back to the optimizer.
#pragma once

#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/export.h"
#include "fsdpx/optimizer.h"

namespace fsdpx {

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
// A context over the world: barrier, all_sum, gather_to_rank0, and primary = first replica.
FSDPX_API CheckpointContext checkpoint_context(const ProcessGroups& groups, const ShardingEngine& engine);
// After a load: the optimizer state into the optimizer. (The trainer state, with the data
// position, is the trainer's TrainerState.)
FSDPX_API void load_optimizer_state(const CheckpointState& state, Optimizer& optimizer);

}  // namespace fsdpx
