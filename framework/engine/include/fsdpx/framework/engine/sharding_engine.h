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
#include "fsdpx/memory_report.h"
#include "fsdpx/seeds.h"
#include "fsdpx/framework/engine/engine_options.h"
#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/model.h"
#include "fsdpx/optimizer.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/sharding_strategy.h"
#include "fsdpx/wrap_policy.h"

namespace fsdpx {

// Persistent per-rank bytes, measured from the storages the engine holds.
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
