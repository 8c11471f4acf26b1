// ShardingEngine: FSDP2's design in C++. Per-parameter dim-0 shards padded to equal size; per
// unit one all-gather into a flat buffer and one reduce-scatter of its gradients; a lifecycle
// around each unit's forward and backward; overlap of the next unit's all-gather with compute.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdpx/export.h"
#include "fsdpx/seeds.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/step_clock.h"
#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/model.h"
#include "fsdpx/optimizer.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/sharding_strategy.h"
#include "fsdpx/wrap_policy.h"

namespace fsdpx {

struct EngineOptions {
  ShardingLayout layout;       // from the sharding strategy
  PrecisionSpec precision;     // from the precision policy (default: fp32 throughout)
  uint64_t seed = 0;           // parameters are initialised from (seed, parameter name)
  bool overlap = true;         // gather the next units while the current one computes
  int prefetch = 1;            // how many units ahead, forward and backward, when overlapping
  // Each unit's own dtypes (the precision policy's answer for its path, "" for the root); unset:
  // `precision` for every unit. Units may differ in compute and reduce dtypes, not in storage.
  std::function<PrecisionSpec(const std::string& unit)> unit_precision;
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
};

// The communicators the engine uses. `shard` has layout.shard_group_size ranks (nullptr when 1);
// `replicate` has layout.replicate_group_size ranks (nullptr when 1); `world` is every rank. They
// carry tensors on the engine's device. `control` (every rank, CPU tensors: ProcessGroups::
// control) carries the engine's metadata; unset: `world`, which must then take CPU tensors.
struct EngineComms {
  std::shared_ptr<Communicator> world;
  std::shared_ptr<Communicator> shard;
  std::shared_ptr<Communicator> replicate;
  std::shared_ptr<Communicator> control;
};

// Persistent per-rank bytes, measured from the storages the engine holds.
struct MemoryReport {
  int64_t param_bytes = 0;      // sharded parameters (padded)
  int64_t grad_bytes = 0;       // sharded gradients (padded)
  int64_t unsharded_bytes = 0;  // gathered parameters allocated right now
};

class FSDPX_API ShardingEngine {
 public:
  // Shards `model` in place. The root is always a unit; `selected` are the others (from a wrap
  // policy), each a layer declared with FSDPX_MODULE (fsdpx/unit.h). Parameters are created one
  // at a time from (options.seed, name) through Model::init_parameter, and only this rank's
  // shard is kept, so the same seed gives the same weights at every world size. Collective over
  // comms.world (checks that every rank built the same model). Throws fsdpx::Error for a model
  // without parameters, a unit fsdpx cannot hook, a parameter shared between units, a module
  // reachable from two places, a layout that does not fit the communicators, or ranks whose
  // models differ.
  ShardingEngine(std::shared_ptr<Model> model, const std::vector<UnitSelection>& selected,
                 EngineComms comms, EngineOptions options);
  ~ShardingEngine();
  ShardingEngine(const ShardingEngine&) = delete;
  ShardingEngine& operator=(const ShardingEngine&) = delete;

  // Runs `forward` (the model's forward and loss) as the root unit's forward, with every unit's
  // lifecycle around it. Returns its result.
  at::Tensor forward(const std::function<at::Tensor()>& forward);
  // loss.backward(), then the end of the step: every unit's gradients reduced into its sharded
  // .grad (unless gradient sync is off), gathered parameters freed. As in FSDP2, a reduction adds
  // to a gradient shard that is held (an earlier synchronised backward, or zero_grad, since the
  // last release_gradients) and writes one that is not: two synchronised backwards without a
  // release between leave the sum of their reduced gradients, in every layout.
  void backward(const at::Tensor& loss);

  // Off: backward accumulates unsharded gradients locally (micro-batches of gradient
  // accumulation); the next backward with sync on reduces the sum.
  void set_requires_gradient_sync(bool sync);

  // Sets every gradient shard to zero (the start of a step in deterministic mode).
  void zero_grad();

  // Frees the gradient shards until the next reduction writes them (FSDP2's
  // zero_grad(set_to_none=True)): the shards have no gradient between, and the memory of every
  // unit's gradient shard is free during the next forward and the backward until that unit
  // reduces. Call it after the optimizer step: until then, every synchronised backward adds to
  // the gradient shards (backward). The deterministic mode adds to them from zero_grad.
  void release_gradients();

  // Clips the sharded gradients so that their global L2 norm is at most max_norm, exactly as
  // clipping the unsharded gradients would. Returns the norm before clipping. Collective.
  double clip_grad_norm(double max_norm);

  // This rank's parameter shards, in unit order, for the optimizer: leaf tensors of shape
  // [rows per shard, ...], updated in place; .grad() is the reduced gradient shard.
  std::vector<ParamShard> shards() const;

  const UnitPlan& plan() const;
  // This rank's index in its shard group, the group's size, and its index among the replicas
  // (0 unless the layout replicates).
  int shard_rank() const;
  int shard_size() const;
  int replicate_rank() const;
  MemoryReport memory() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdpx
