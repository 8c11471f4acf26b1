// EngineOptions and EngineComms: what a ShardingEngine is built with (sharding_engine.h), in a
// header of their own, so that the engine's parts read them without the engine's interface.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "fsdpx/reshard_after_forward.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/engine/step_trace.h"
#include "fsdpx/framework/runtime/step_clock.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/sharding_strategy.h"

namespace fsdpx {

struct EngineOptions {
  ShardingLayout layout;       // from the sharding strategy
  PrecisionSpec precision;     // from the precision policy (default: fp32 throughout)
  uint64_t seed = 0;           // parameters are initialised from (seed, parameter name)
  bool overlap = true;         // gather the next units while the current one computes
  // How many units ahead, forward and backward, when overlapping. The bound that follows: of the
  // units that reshard after forward, at most prefetch + 1 hold gathered parameters or an
  // all-gather in flight at any time (the one computing and those gathered ahead); without
  // overlap, one (EngineSteps.GatheredUnitsAreBoundedByThePrefetchDepth). The root stays gathered.
  int prefetch = 1;
  // Each unit's own dtypes (the precision policy's answer for its path, "" for the root); unset:
  // `precision` for every unit. Units may differ in compute and reduce dtypes, not in storage.
  std::function<PrecisionSpec(const std::string& unit)> unit_precision;
  // The units whose linear layers compute in float8 (fsdpx/float8.h: the engine turns float8 on
  // around their forward and recompute); unset: none.
  std::function<bool(const std::string& unit)> unit_float8;
  // float8 all-gather (fsdpx::Float8AllGather): the float8 units gather the weights the model
  // lists (fsdpx::LinearWeights) in e4m3, with scales computed for all of them before each
  // forward (one all-reduce of their amaxes over the shard group). Needs a shard group of more
  // than one rank and such weights: refused otherwise.
  bool float8_all_gather = false;
  // Units (by path) that reshard after forward otherwise than layout.reshard_after_forward says,
  // as FSDP2's reshard_after_forward per fully_shard call (ReshardAfterForward: true, false or
  // an int). A path that is no unit, the root's "" (the root never reshards), or an int that does
  // not divide the shard group's size is refused. Units over one rank gather nothing either way.
  std::map<std::string, ReshardAfterForward> reshard_after_forward_by_unit;
  // Layout-invariant sums: each backward is one sample per world rank (rank r's is global sample
  // j * W + r of the round), and adds every rank's gradient rows of this rank's shard, sent by one
  // all-to-all over comms.world (unsharded: one all-gather), into the gradient shard in rank
  // order: a fixed, sequential order over global samples at any world size and strategy. Nothing is averaged (the loss
  // carries 1 / global samples), and the shards accumulate until zero_grad(). clip_grad_norm sums in exact fixed point.
  bool deterministic = false;
  // Where shards, gathered units, gradients and activations live (fsdpx/framework/runtime/
  // device.h); unset: the CPU. With layout.offload_to_cpu the shards, their gradients (and so the
  // optimizer's state and step) stay in host memory, and only what a unit computes with moves.
  std::shared_ptr<const DeviceRuntime> device;
  // Where the step's time goes (fsdpx/framework/runtime/step_clock.h): the engine marks the compute
  // stream's waits for all-gathers and reductions on it while a step's span is open; unset: none.
  std::shared_ptr<StepClock> clock;
  // The optimizer step inside backward: called with each unit's shards, the range [first, first +
  // count) of ShardingEngine::shards(), once their gradients are final in a synchronised backward
  // (reduced, and averaged across replicas; the compute stream has waited for them), after which
  // the engine frees that unit's gradient shard: no rank holds every gradient shard at once.
  // One synchronised backward per step: a second one before release_gradients() is refused (it
  // would step every unit again), and so is `deterministic` (one synchronised backward per
  // sample). A backward that fails half-way leaves the units it stepped stepped.
  // Unset: the gradient shards stay until release_gradients().
  std::function<void(size_t first, size_t count)> step_in_backward;
  // Activation offload: the units (by path) whose main input (the first argument, the hidden
  // state: what a recomputed unit keeps for its backward, besides arguments shared by every layer)
  // goes to host memory (DeviceRuntime::host_options) on the offload stream during forward and
  // comes back, one unit ahead, before its backward (activation_offload.h has the protocol). Each
  // must recompute (activation checkpointing): LibTorch's C++ autograd has no saved-tensor hooks,
  // so only what the Recompute function itself keeps can move. A path that is no unit, the root,
  // or a unit that does not recompute is refused. On the CPU the activations are in host memory
  // already, and nothing moves.
  std::set<std::string> activation_offload_units;
  // The step's events as they happen (step_trace.h), for tests; unset: none.
  StepTrace step_trace;
};

// unit_precision, unit_float8 and float8_all_gather from a precision policy (its fsdpx::Float8Units
// and fsdpx::Float8AllGather, if it declares them).
FSDPX_API void use_precision_policy(EngineOptions& o, std::shared_ptr<const PrecisionPolicy> policy);

// The unit's own reshard_after_forward (EngineOptions::reshard_after_forward_by_unit), if set.
inline std::optional<ReshardAfterForward> reshard_choice_of(const EngineOptions& o, const std::string& unit) {
  const auto it = o.reshard_after_forward_by_unit.find(unit);
  return it == o.reshard_after_forward_by_unit.end() ? std::nullopt
                                                      : std::optional<ReshardAfterForward>(it->second);
}

// The communicators the engine uses. `shard` has layout.shard_group_size ranks (nullptr when 1);
// `replicate` has layout.replicate_group_size ranks (nullptr when 1); `world` is every rank. They
// carry tensors on the engine's device. `control` (every rank, CPU tensors: ProcessGroups::
// control) carries the engine's metadata; unset: `world`, which must then take CPU tensors.
struct EngineComms {
  std::shared_ptr<Communicator> world;
  std::shared_ptr<Communicator> shard;
  std::shared_ptr<Communicator> replicate;
  std::shared_ptr<Communicator> control;
  // Post-forward groups (reshard_after_forward = k): by k, the group of the k consecutive ranks that
  // holds this rank (within its shard group), over which a unit with that k all-gathers for backward.
  std::map<int, std::shared_ptr<Communicator>> post_forward;
};

}  // namespace fsdpx
