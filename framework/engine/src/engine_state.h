// The state of one ShardingEngine, shared by its units (ShardingEngine::Impl).
#pragma once

#include <memory>
#include <vector>

#include "engine_config.h"
#include "unit.h"

namespace fsdpx {

// The hooks of an engine's units in FSDPX_MODULE's registry, removed when this goes (also when
// the engine's construction fails after installing them).
class InstalledHooks {
 public:
  // Installs every non-root unit of `units`, all or none (fsdpx::Error when a module already
  // has hooks: it is a unit of another live engine), and a gradient hook on each trainable
  // parameter of every unit.
  explicit InstalledHooks(const std::vector<std::unique_ptr<Unit>>& units);
  ~InstalledHooks();
  InstalledHooks(const InstalledHooks&) = delete;
  InstalledHooks& operator=(const InstalledHooks&) = delete;

 private:
  std::vector<const torch::nn::Module*> modules_;
  std::vector<UnitHooks*> hooks_;
  // Each trainable parameter's gradient hook (Unit::on_parameter_gradient), by index.
  std::vector<std::pair<at::Tensor, unsigned>> gradient_hooks_;
};

struct ShardingEngine::Impl {
  Impl();   // registers the engine among the live ones (live_unit finds it)
  ~Impl();  // unregisters it first, so that a graph outliving it gets an error, not freed memory
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  const int64_t id;  // unique for the process's lifetime; what autograd nodes and hooks keep
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
  // FSDP2's bound on transient memory: at most one unit's reduction in flight, and (hybrid) one
  // all-reduce across replicas. The next unit's reduction waits for the previous one first.
  ParamGroup* reducing = nullptr;
  ParamGroup* replicating = nullptr;

  // Issues the gathers of the next `prefetch` units after `u` in `order` that still need one.
  void prefetch_after(Unit* u, const std::vector<Unit*>& order);
  // Issues `g`'s reduction after waiting for the one in flight (which overlapped the backward
  // compute of `g`'s unit) and freeing its buffers.
  void reduce(ParamGroup& g);
  // Waits for the reduction in flight, if any; hybrid: then issues its all-reduce across
  // replicas after waiting for the previous one.
  void finish_in_flight_reduce();
  // The end of a backward: units whose post-backward did not fire finished, reductions waited.
  void finish_backward();
  // Brings every unit back to rest after a forward without backward or a failed backward:
  // pending gathers and reductions waited for and dropped, parameters resharded; with
  // drop_grads, unsharded gradients discarded too.
  void abort_step(bool drop_grads);
  // Throws fsdpx::Error unless `gen` is the current forward's and its backward has not finished.
  void check_generation(uint64_t gen, const std::string& unit) const;

  // Last, so that it goes first: no hook points at a unit being destroyed.
  std::unique_ptr<InstalledHooks> hooks;
};

// Where autograd finds a unit: by engine id and unit index, not by pointer, so that a graph that
// outlives its engine gets a clear fsdpx::Error naming `fqn` instead of reading freed memory.
Unit& live_unit(int64_t engine, int64_t index, const std::string& fqn);
// The engine `id` if it is still alive, else nullptr.
ShardingEngine::Impl* live_engine(int64_t id);

// Builds the units of `e` from the model and the wrap policy's selection, checks that every rank
// built the same, shards and initialises the parameters, and installs the units' hooks.
void build_engine(ShardingEngine::Impl& e, const std::vector<UnitSelection>& selected);

}  // namespace fsdpx
