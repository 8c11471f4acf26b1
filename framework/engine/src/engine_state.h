// The state of one ShardingEngine, shared by its units (ShardingEngine::Impl).
#pragma once

#include <memory>
#include <vector>

#include "engine_config.h"
#include "unit.h"

namespace fsdpx {

struct ShardingEngine::Impl {
  std::shared_ptr<Model> model;
  EngineConfig config;
  std::vector<std::unique_ptr<Unit>> units;  // root first
  UnitPlan plan;
  bool sync = true;
  // Each forward is a generation; its hooks and autograd nodes carry it, so a backward that
  // reaches an earlier forward's graph, or a second backward over one forward, is refused.
  uint64_t generation = 0, finished_generation = 0;
  bool in_backward = false;        // a backward of `generation` has started and not finished
  bool awaiting_backward = false;  // the last forward's output needs a backward
  std::vector<Unit*> forward_order, last_forward_order;

  // Issues the gathers of the next `prefetch` units after `u` in `order` that still need one.
  void prefetch_after(Unit* u, const std::vector<Unit*>& order);
  // The end of a backward: units whose post-backward did not fire finished, reductions waited.
  void finish_backward();
  // Brings every unit back to rest after a forward without backward or a failed backward:
  // pending gathers and reductions waited for and dropped, parameters resharded; with
  // drop_grads, unsharded gradients discarded too.
  void abort_step(bool drop_grads);
  // Throws fsdpx::Error unless `gen` is the current forward's and its backward has not finished.
  void check_generation(uint64_t gen, const std::string& unit) const;
};

// Builds the units of `e` from the model and the wrap policy's selection, checks that every rank
// built the same, shards and initialises the parameters, and installs the units' hooks.
void build_engine(ShardingEngine::Impl& e, const std::vector<UnitSelection>& selected);

}  // namespace fsdpx
