// The state of one ShardingEngine, shared by its units (ShardingEngine::Impl).
#pragma once

#include <memory>
#include <vector>

#include "engine_config.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "sharding_unit.h"

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

struct ShardingEngine::Impl final : StepContext {
  Impl();   // registers the engine among the live ones (live_unit finds it)
  ~Impl();  // unregisters it first, so that a graph outliving it gets an error, not freed memory
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  const int64_t id;  // unique for the process's lifetime; what autograd nodes and hooks keep
  std::shared_ptr<Model> model;
  EngineConfig config;
  std::vector<std::unique_ptr<Unit>> units;  // root first
  UnitPlan plan;
  bool sync = true;  // set_requires_gradient_sync
  TrainingState state = TrainingState::Idle;
  bool float8_checked = false;  // a forward has shown that the float8 units compute float8 linears
  // Each forward is a generation; its hooks and autograd nodes carry it, so a backward that
  // reaches an earlier forward's graph, or a second backward over one forward, is refused.
  uint64_t current = 0, finished_generation = 0;
  std::vector<Unit*> forward_order, last_forward_order;
  // FSDP2's bound on transient memory: at most one unit's reduction in flight, and (hybrid) one
  // all-reduce across replicas. The next unit's reduction waits for the previous one first.
  ParamGroup* reducing = nullptr;
  ParamGroup* replicating = nullptr;
  // Each unit's first shard in ShardingEngine::shards() (EngineOptions::step_in_backward's ranges),
  // and whether a unit was stepped since the last release_gradients().
  std::vector<size_t> first_shard;
  bool stepped = false;
  // Activation offload: the inputs of the last unit whose copies to host memory may still run.
  std::vector<at::Tensor> offloading;

  // StepContext (step_context.h). reduce: `g`'s reduction is issued after waiting for the one in
  // flight (which overlapped the backward compute of `g`'s unit) and freeing its buffers.
  int64_t engine_id() const override { return id; }
  uint64_t generation() const override { return current; }
  const EngineConfig& engine_config() const override { return config; }
  void check_generation(uint64_t gen, const std::string& unit) const override;
  void forward_began(Unit& u) override;
  void prefetch_after(Unit& u, bool backward) override;
  void backward_began(uint64_t gen) override;
  void finish_in_flight_reduce() override;
  void offload_issued(std::vector<at::Tensor> sources) override;
  void release_offloading() override;
  void load_offloaded(Unit& u) override;
  void reduce(ParamGroup& g) override;
  // Waits for the all-reduce across replicas in flight, if any; its gradients are then final.
  void finish_replicate();
  // Issues the gathers of the next `prefetch` units after `u` in `order` that still need one.
  void prefetch_in(Unit* u, const std::vector<Unit*>& order);
  // `g`'s gradient shard is final for this step (reduced, and averaged across replicas): with
  // EngineOptions::step_in_backward, its unit's shards are stepped and its gradient shard freed.
  void gradients_final(ParamGroup& g);
  // The end of a backward: units whose post-backward did not fire finished, reductions waited.
  void finish_backward();
  // Brings every unit back to rest after a forward without backward or a failed backward:
  // pending gathers and reductions waited for and dropped, parameters resharded; with
  // drop_grads, unsharded gradients discarded too.
  void abort_step(bool drop_grads);

  // Last, so that it goes first: no hook points at a unit being destroyed.
  std::unique_ptr<InstalledHooks> hooks;
};

// Where autograd finds a unit: by engine id and unit index, not by pointer, so that a graph that
// outlives its engine gets a clear fsdpx::Error naming `fqn` instead of reading freed memory.
Unit& live_unit(int64_t engine, int64_t index, const std::string& fqn);
// The engine `id` if it is still alive, else nullptr.
ShardingEngine::Impl* live_engine(int64_t id);

}  // namespace fsdpx
