// The memory plan: a step's peak bytes per rank, predicted before anything is allocated.
//
// It replays the engine's protocol (ParamGroup, Unit, ShardingEngine::Impl) with byte counts in
// place of tensors: what each unit gathers, when it frees it, the one reduction in flight and
// its buffers, the gradient shards held from a unit's reduction to the optimizer step, and the
// activations the model states (fsdpx/activation_memory.h), layer by layer in the order the
// forward and the backward run them. The order's rules are written once (the engine's
// step_order.h), and EngineSteps.TheMemoryPlanFollowsTheEnginesStep compares this replay's events
// (StepMemoryInput::step_trace) with the engine's, one by one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdpx/activation_memory.h"
#include "fsdpx/export.h"
#include "fsdpx/framework/engine/step_time.h"
#include "fsdpx/framework/engine/step_trace.h"
#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/reshard_after_forward.h"
#include "fsdpx/sharding_strategy.h"

namespace fsdpx {

// One unit as the plan sees it.
struct UnitMemory {
  std::string fqn;  // "" for the root
  int64_t shard_numel = 0;  // this rank's flat shard, padded (padded_shard_numel, shard_geometry.h)
  int64_t float8_numel = 0;  // of it, the elements gathered in float8 (float8 all-gather)
  std::vector<std::pair<std::string, int64_t>> params;  // trainable parameters: name, elements
  PrecisionSpec dtypes;
  bool recompute = false;  // activation checkpointing
  // Activation offload on a device (EngineOptions::activation_offload_units): the recomputed
  // unit's input goes to host memory in forward and comes back one unit ahead of its backward.
  bool offload_activations = false;
  // its own setting (EngineOptions::reshard_after_forward_by_unit)
  std::optional<ReshardAfterForward> reshard_after_forward;
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
  // Whether the reduce-scatter's receive buffer is in the planned memory: Gloo's all-to-all on the
  // CPU (run_plan sets it so), whose buffer holds every rank's slice but this rank's own on the first
  // and last rank ((S - 1) / S of its input), the whole in between. sim and CUDA have none there.
  bool staged_reduce = true;
  bool clip_grad_norm = false;
  // cpu_offload on a device: shards, gradient shards and optimizer state in host memory; a unit's
  // shard comes to the device for its all-gather, its reduced gradient shard goes back.
  bool offload = false;
  // The optimizer step inside backward (EngineOptions::step_in_backward): each unit's gradient
  // shard goes once its reduction (and, hybrid, its all-reduce across replicas) is finished.
  bool step_in_backward = false;
  // The replayed step's events (step_trace.h), to compare with the engine's; unset: none.
  StepTrace step_trace;
  // What the step's work costs (step_time.h): with it, the replay predicts the step's time too.
  const StepCosts* costs = nullptr;
};

// Bytes per rank.
struct StepMemory {
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;  // shards and state
  int64_t activation_bytes = 0;  // what one forward keeps for its backward
  int64_t forward_peak = 0, backward_peak = 0, optimizer_peak = 0;
  int64_t peak = 0;        // the step's: the largest of the three
  std::string peak_where;  // e.g. "backward of unit layers.0, its previous unit's reduction in flight"
  int64_t host_bytes = 0;  // offloading: what host memory holds (shards, gradient shards, optimizer state)
  int64_t activation_host_bytes = 0;  // activation offload: the inputs in host memory after a forward
  StepTime time;  // with StepMemoryInput::costs: the step's seconds (step_time.h); else none
};

FSDPX_API StepMemory predict_step_memory(const StepMemoryInput& input);

// The units of `plan` as the memory plan sees them: each one's shard padded over `shard_size`
// ranks, its parameters, `dtypes[i]` (unit i's), and whether it recomputes. The run plan and
// tests build StepMemoryInput::units with it.
FSDPX_API std::vector<UnitMemory> units_for_memory(const UnitPlan& plan, int64_t shard_size,
                                                   const std::vector<PrecisionSpec>& dtypes);

}  // namespace fsdpx
