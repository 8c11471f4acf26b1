// The engine facade: a step's forward and backward around the units, and what the optimizer,
// checkpoints and planners read.
#include "fsdpx/framework/engine/sharding_engine.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "activation_offload.h"
#include "engine_builder.h"
#include "engine_state.h"
#include "fsdpx/error.h"
#include "fsdpx/float8.h"
#include "fsdpx/framework/base/fault_injection.h"
#include "fsdpx/framework/base/unit_registry.h"
#include "fsdpx/framework/runtime/collective_context.h"
#include "sharded_param.h"
#include "step_order.h"

namespace fsdpx {

// ---- Live engines and their hooks -------------------------------------------------------------

namespace {

std::mutex& live_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<int64_t, ShardingEngine::Impl*>& live() {
  static std::unordered_map<int64_t, ShardingEngine::Impl*> engines;
  return engines;
}
int64_t next_engine_id() {
  static std::atomic<int64_t> next{1};
  return next++;
}

// FSDPX_FAULT=skip-offload-wait:R (fsdpx/framework/base/fault_injection.h): global rank R lets
// the first offloaded inputs go without the compute stream waiting for their copies to host
// memory, as a bug would. On a GPU the memory may be handed out again while the copy still
// reads it; sim's stream-order check reports it.
bool fault_skips_offload_wait(const EngineConfig& config) {
  static std::atomic<bool> done{false};
  if (done.load()) return false;
  const int rank = config.comms.world ? config.comms.world->rank() : 0;
  if (!fault_requested("skip-offload-wait", rank)) return false;
  done.store(true);
  std::fprintf(stderr, "fsdpx: FSDPX_FAULT=skip-offload-wait:%d: rank %d frees offloaded inputs without waiting\n",
               rank, rank);
  return true;
}

}  // namespace

ShardingEngine::Impl::Impl() : id(next_engine_id()) {
  std::lock_guard<std::mutex> lock(live_mutex());
  live()[id] = this;
}

ShardingEngine::Impl::~Impl() {
  std::lock_guard<std::mutex> lock(live_mutex());
  live().erase(id);
}

ShardingEngine::Impl* live_engine(int64_t id) {
  std::lock_guard<std::mutex> lock(live_mutex());
  auto it = live().find(id);
  return it == live().end() ? nullptr : it->second;
}

Unit& live_unit(int64_t engine, int64_t index, const std::string& fqn) {
  ShardingEngine::Impl* e = live_engine(engine);
  if (!e || index < 0 || index >= static_cast<int64_t>(e->units.size()))
    throw Error("backward reached " + (fqn.empty() ? std::string("the root") : "unit '" + fqn + "'") +
                " of a ShardingEngine that no longer exists; run each backward while its engine is alive");
  return *e->units[static_cast<size_t>(index)];
}

InstalledHooks::InstalledHooks(const std::vector<std::unique_ptr<Unit>>& units) {
  std::vector<std::string> names;
  for (const auto& u : units)
    if (!u->root) {
      modules_.push_back(u->module);
      hooks_.push_back(u.get());
      names.push_back(u->fqn);
    }
  install_unit_hooks(modules_, hooks_, names);
  for (const auto& u : units)
    for (const ShardedParam& p : u->group.params) {
      if (!p.param.requires_grad()) continue;
      // By id, not pointer: a graph may outlive the engine (its hooks are removed with it).
      const unsigned idx =
          p.param.register_hook([engine = u->step->engine_id(), index = u->index, name = u->fqn](const at::Tensor& g) {
            if (live_engine(engine)) live_unit(engine, index, name).on_parameter_gradient(g.numel());
          });
      gradient_hooks_.emplace_back(p.param, idx);
    }
}

InstalledHooks::~InstalledHooks() {
  for (auto& [param, idx] : gradient_hooks_) param.remove_hook(idx);
  remove_unit_hooks(modules_, hooks_);
}

// ---- The engine's state ------------------------------------------------------------------------

void ShardingEngine::Impl::forward_began(Unit& u) {
  // Between steps the parameters are this rank's shards: a unit run outside the engine's forward
  // would compute with them (or fail on a shape), so it is refused in one line.
  if (state == TrainingState::Idle || state == TrainingState::AwaitingBackward)
    throw Error("unit '" + u.fqn + "' ran outside the sharded module's forward: run the model and the loss inside "
                "ShardedModule::forward's function (fsdp->forward([&] { return loss_of(model->forward(x)); })), "
                "which gathers the root's and every unit's parameters for them");
  forward_order.push_back(&u);
}

void ShardingEngine::Impl::prefetch_after(Unit& u, bool backward) {
  prefetch_in(&u, backward ? backward_order(last_forward_order) : last_forward_order);
}

void ShardingEngine::Impl::backward_began(uint64_t gen) {
  if (state == TrainingState::Backward) return;
  state = TrainingState::Backward;
  torch::autograd::Engine::get_default_engine().queue_callback([id = id, gen] {
    ShardingEngine::Impl* e = live_engine(id);
    if (e && e->current == gen && e->state == TrainingState::Backward) e->finish_backward();
  });
}

void ShardingEngine::Impl::prefetch_in(Unit* u, const std::vector<Unit*>& order) {
  fsdpx::prefetch_after(
      order, u, config.options.overlap, config.options.prefetch,
      [](Unit* v) { return v->stage == Unit::BackwardStage::Done; },
      [](Unit* v) {
        if (v->group.state == ParamGroup::State::Sharded) v->group.start_gather();
      });
}

void ShardingEngine::Impl::check_generation(uint64_t gen, const std::string& unit) const {
  const std::string name = unit.empty() ? "the root" : "unit '" + unit + "'";
  if (gen != current)
    throw Error("backward reached " + name + " of an earlier forward: fsdpx needs each forward's backward before the "
                "next forward (for gradient accumulation, run forward and backward per micro-batch with "
                "set_requires_gradient_sync(false))");
  if (gen == finished_generation)
    throw Error("a second backward reached " + name + " of the same forward: fsdpx gathers and reduces each unit "
                "once per forward; run forward again");
}

void ShardingEngine::Impl::reduce(ParamGroup& g) {
  if (!sync) return;
  finish_in_flight_reduce();
  trace_step(config.options.step_trace, "reduce", g.root, g.label);
  g.reduce_grads();
  reducing = &g;
}

void ShardingEngine::Impl::finish_in_flight_reduce() {
  if (!reducing) return;
  ParamGroup& g = *std::exchange(reducing, nullptr);
  g.finish_reduce();
  trace_step(config.options.step_trace, "reduced", g.root, g.label);
  if (!g.needs_replicate()) return gradients_final(g);
  finish_replicate();
  g.start_replicate();
  replicating = &g;
}

void ShardingEngine::Impl::finish_replicate() {
  if (!replicating) return;
  ParamGroup& g = *std::exchange(replicating, nullptr);
  g.finish_replicate();
  gradients_final(g);
}

void ShardingEngine::Impl::gradients_final(ParamGroup& g) {
  const auto& step = config.options.step_in_backward;
  if (!step) return;
  for (const auto& u : units) {
    if (&u->group != &g) continue;
    trace_step(config.options.step_trace, "step", g.root, g.label);
    stepped = true;
    step(first_shard[static_cast<size_t>(u->index)], g.params.size());
    g.release_gradients();
    return;
  }
}

void ShardingEngine::Impl::offload_issued(std::vector<at::Tensor> sources) {
  release_offloading();
  offloading = std::move(sources);
}

void ShardingEngine::Impl::release_offloading() {
  if (offloading.empty()) return;
  if (!fault_skips_offload_wait(config))
    config.device->wait_stream(StreamRole::Compute, StreamRole::Offload);  // the copies read them
  offloading.clear();
}

void ShardingEngine::Impl::load_offloaded(Unit& u) {
  if (config.options.activation_offload_units.empty()) return;  // no order to copy on every unit's backward
  for (Unit* v : loads_at_backward(backward_order(last_forward_order), &u)) load_inputs(*config.device, v->offloaded);
}

void ShardingEngine::Impl::finish_backward() {
  CollectivePhase phase("backward");
  // Units whose post-backward did not fire (inputs that need no gradient, such as token ids,
  // and the root), latest first.
  for (auto it = units.rbegin(); it != units.rend(); ++it) (*it)->post_backward();
  finish_in_flight_reduce();
  finish_replicate();
  abort_step(/*drop_grads=*/false);  // gathers prefetched for units whose backward never came
  finished_generation = current;
  state = TrainingState::Idle;
}

void ShardingEngine::Impl::abort_step(bool drop_grads) {
  reducing = replicating = nullptr;  // each group waits for and drops its own below
  // Offloaded inputs in flight either way, and those loaded for a backward that never came.
  if (!config.options.activation_offload_units.empty()) config.device->join_streams();
  offloading.clear();
  for (auto& u : units) {
    u->drop_recompute();  // a forward whose backward never came: let its graph go
    u->group.abandon(drop_grads);
    u->group.show_shards();
  }
  state = TrainingState::Idle;
}

// ---- The facade --------------------------------------------------------------------------------

ShardingEngine::ShardingEngine(std::shared_ptr<Model> model, const std::vector<UnitSelection>& selected,
                               EngineComms comms, EngineOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->model = std::move(model);
  impl_->config.comms = std::move(comms);
  impl_->config.options = options;
  impl_->config.device = options.device ? options.device : open_device("cpu", 0);
  if (options.step_in_backward && options.deterministic)
    throw Error("the optimizer step inside backward needs one synchronised backward per step, and the deterministic "
                "mode runs one per sample; drop one of them");
  build_engine(*impl_, selected);
  size_t first = 0;
  for (const auto& u : impl_->units) {
    impl_->first_shard.push_back(first);
    first += u->group.params.size();
  }
}

ShardingEngine::~ShardingEngine() = default;

namespace {

// A precision policy that asks for float8 in units none of whose linears can take it (a model
// without fsdpx::linear, or without weights float8_eligible accepts) would train in bf16 while
// saying float8: refused after the first forward, which is the first that can tell.
void check_float8_ran(ShardingEngine::Impl& e, uint64_t float8_before) {
  if (e.float8_checked) return;
  std::string units;
  for (const auto& u : e.units)
    if (u->float8) units += std::string(units.empty() ? "" : ", ") + (u->root ? "root" : u->fqn);
  if (units.empty() || float8_linears_computed() > float8_before) {
    e.float8_checked = true;
    return;
  }
  throw Error("the precision policy computes the linear layers of " + units + " in float8, and none of them "
              "computed a float8 linear in this forward: their layers use no fsdpx::linear with a weight whose two "
              "sizes are multiples of 16 (fsdpx/float8.h); use --precision bf16_mixed for this model");
}

}  // namespace

at::Tensor ShardingEngine::forward(const std::function<at::Tensor()>& f) {
  Impl& e = *impl_;
  CollectivePhase phase("forward");
  // A forward whose backward never came (validation with grad on, a skipped step), or a
  // backward that failed half-way: bring everything back to rest. Everything is resharded, the
  // root too, so that the new forward gathers what the optimizer last wrote.
  if (e.state == TrainingState::Backward) e.abort_step(/*drop_grads=*/true);
  if (e.state == TrainingState::AwaitingBackward || e.state == TrainingState::Forward) e.abort_step(false);
  for (auto& u : e.units) {
    u->group.reshard();
    u->begin_step();
    u->group.hide_shards();  // module->parameters() were the shards since the last step
  }
  ++e.current;
  e.state = TrainingState::Forward;
  e.forward_order.clear();
  Unit& root = *e.units[0];
  at::Tensor out;
  try {
    if (e.config.options.float8_all_gather) {
      std::vector<ParamGroup*> groups;
      for (auto& u : e.units) groups.push_back(&u->group);
      set_float8_scales(groups);  // before any all-gather of this forward casts a shard with them
    }
    root.pre_forward({});
    const uint64_t float8_before = float8_linears_computed();
    out = root.post_forward([&] {
      Float8Scope scope(root.float8);  // the root's own layers, as Unit::run does for the others
      return f();
    }());
    check_float8_ran(e, float8_before);
    e.release_offloading();
    for (auto& u : e.units)
      if (!u->root && !u->group.params.empty() && u->forward_calls == 0)
        throw Error("unit '" + u->fqn + "' did not run in this forward; call it through its FSDPX_MODULE holder "
                    "(`layer(x)`), not layer->forward(x)");
  } catch (const c10::Error& err) {
    // A read of a sharded unit's parameter (its forward called around its holder) is one line,
    // without LibTorch's backtrace; the step is abandoned as below.
    e.abort_step(/*drop_grads=*/false);
    const std::string what = err.what_without_backtrace();
    if (what.find(kNotGatheredHere) != std::string::npos) throw Error(what.substr(0, what.find('\n')));
    throw;
  } catch (...) {
    // Gathers in flight (prefetched for units the forward never reached) waited for and
    // dropped, everything resharded: the next forward gathers what the shards hold then.
    // Gradients accumulated by earlier micro-batches stay.
    e.abort_step(/*drop_grads=*/false);
    throw;
  }
  e.last_forward_order = e.forward_order;
  if (!at::GradMode::is_enabled() || !out.requires_grad()) {
    for (auto& u : e.units) {  // no backward will follow
      u->group.reshard();
      u->group.drop_post_forward();
      u->group.show_shards();
    }
    e.state = TrainingState::Idle;
  } else {
    e.state = TrainingState::AwaitingBackward;
  }
  return out;
}

void ShardingEngine::backward(const at::Tensor& loss) {
  Impl& e = *impl_;
  if (e.stepped && e.sync)
    throw Error("the optimizer step inside backward stepped every unit in the last synchronised backward; call "
                "release_gradients() before the next one (micro-batches before a step's last run with "
                "set_requires_gradient_sync(false))");
  try {
    loss.backward();
    // The final callback did not run: no unit's hook fired (the loss does not depend on them).
    const bool pending = e.state == TrainingState::AwaitingBackward || e.state == TrainingState::Backward;
    if (pending && e.finished_generation != e.current) e.finish_backward();
  } catch (...) {
    e.abort_step(/*drop_grads=*/true);
    throw;
  }
}

void ShardingEngine::set_requires_gradient_sync(bool sync) { impl_->sync = sync; }

void ShardingEngine::release_gradients() {
  for (auto& u : impl_->units) u->group.release_gradients();
  impl_->stepped = false;
}

void ShardingEngine::zero_grad() {
  at::NoGradGuard no_grad;
  for (auto& u : impl_->units) {
    u->group.hold_gradients(/*zero=*/false);
    u->group.flat_grad.zero_();
  }
}

std::vector<ParamShard> ShardingEngine::shards() const {
  std::vector<ParamShard> out;
  for (auto& u : impl_->units)
    for (auto& p : u->group.params) out.push_back({p.name, p.shard});
  return out;
}

const UnitPlan& ShardingEngine::plan() const { return impl_->plan; }
int ShardingEngine::shard_rank() const { return impl_->config.shard_rank; }
int ShardingEngine::shard_size() const { return static_cast<int>(impl_->config.shard_size); }
int ShardingEngine::replicate_rank() const {
  return impl_->config.comms.replicate ? impl_->config.comms.replicate->rank() : 0;
}

MemoryReport ShardingEngine::memory() const {
  MemoryReport m;
  for (auto& u : impl_->units) {
    const ParamGroup& g = u->group;
    m.param_bytes += static_cast<int64_t>(g.flat_shard.storage().nbytes());
    m.grad_bytes += g.flat_grad.numel() * static_cast<int64_t>(g.flat_grad.element_size());  // while held
    if (g.separate()) m.unsharded_bytes += static_cast<int64_t>(g.unsharded.nbytes());
    if (g.float8_gather.on()) m.unsharded_bytes += static_cast<int64_t>(g.float8_gather.storage.nbytes());
    if (g.post_forward.defined()) m.post_forward_bytes += g.post_forward.numel() * g.post_forward.element_size();
  }
  return m;
}

}  // namespace fsdpx
