// The memory plan: a step's peak bytes per rank, predicted before anything is allocated.
//
// It replays the engine's protocol (ParamGroup, Unit, ShardingEngine::Impl) with byte counts in
// place of tensors: what each unit gathers, when it frees it, the one reduction in flight and
// its buffers, the gradient shards held from a unit's reduction to the optimizer step, and the
// activations the model states (fsdpx/activation_memory.h), layer by layer in the order the
// forward and the backward run them. A change to the protocol changes this replay with it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdpx/activation_memory.h"
#include "fsdpx/export.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/sharding_strategy.h"

namespace fsdpx {

// One unit as the plan sees it.
struct UnitMemory {
  std::string fqn;  // "" for the root
  int64_t shard_numel = 0;  // this rank's flat shard, padded (padded_shard_numel, shard_geometry.h)
  std::vector<std::pair<std::string, int64_t>> params;  // trainable parameters: name, elements
  PrecisionSpec dtypes;
  bool recompute = false;  // activation checkpointing
};

struct StepMemoryInput {
  std::vector<UnitMemory> units;  // the root first, then the others in module order
  ShardingLayout layout;
  int world_size = 1;
  int64_t optimizer_bytes = 0;  // this rank's optimizer state
  std::vector<LayerActivations> layers;  // per forward, in order (empty: not stated by the model)
  bool overlap = true;
  int prefetch = 1;
  bool deterministic = false;
  int64_t forwards = 1;  // forward-backward passes per step: micro-batches, or samples (deterministic)
  // Gloo: the reduce-scatter is an all-to-all, whose receive buffer is as large as its input.
  bool staged_reduce = true;
  bool clip_grad_norm = false;
};

// Bytes per rank.
struct StepMemory {
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;  // shards and state
  int64_t activation_bytes = 0;  // what one forward keeps for its backward
  int64_t forward_peak = 0, backward_peak = 0, optimizer_peak = 0;
  int64_t peak = 0;        // the step's: the largest of the three
  std::string peak_where;  // e.g. "backward of unit layers.0, its previous unit's reduction in flight"
};

FSDPX_API StepMemory predict_step_memory(const StepMemoryInput& input);

}  // namespace fsdpx
