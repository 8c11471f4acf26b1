#include "fsdpx/framework/sharding_engine.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/suggest.h"
#include "fsdpx/unit.h"

namespace fsdpx {

// ---- Wrappable-layer registry (fsdpx/unit.h) -------------------------------------------------

UnitHooks::~UnitHooks() = default;

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<const torch::nn::Module*, std::weak_ptr<torch::nn::Module>>& wrappable() {
  static std::unordered_map<const torch::nn::Module*, std::weak_ptr<torch::nn::Module>> w;
  return w;
}
std::unordered_map<const torch::nn::Module*, UnitHooks*>& installed_hooks() {
  static std::unordered_map<const torch::nn::Module*, UnitHooks*> h;
  return h;
}
}  // namespace

bool is_wrappable(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = wrappable().find(&module);
  return it != wrappable().end() && it->second.lock().get() == &module;
}

namespace detail {
void mark_wrappable(const std::shared_ptr<torch::nn::Module>& module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  wrappable()[module.get()] = module;
}
UnitHooks* hooks_of(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = installed_hooks().find(module);
  return it == installed_hooks().end() ? nullptr : it->second;
}
}  // namespace detail

// ---- Deferred parameters (fsdpx/model.h) -----------------------------------------------------

at::Tensor deferred_tensor(at::IntArrayRef shape) {
  at::Tensor t = at::empty({0}, at::kFloat);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);  // sizes only; the storage stays empty
  return t;
}

Batch next_token_batch(const at::Tensor& sequences) {
  const int64_t t = sequences.size(1) - 1;
  Batch b;
  b.inputs = sequences.narrow(1, 0, t).contiguous();
  b.targets = sequences.narrow(1, 1, t).contiguous();
  b.samples = sequences.size(0);
  b.tokens = b.samples * t;
  return b;
}

// ---- Seeds -------------------------------------------------------------------------------------

uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the name, then splitmix64 with the seed
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  uint64_t z = h ^ (seed + 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// ---- Units -------------------------------------------------------------------------------------

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void resize_storage(const c10::Storage& storage, size_t bytes) {
  at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), bytes);
}

// A tensor of `sizes` over `storage` from element `offset`, with its own version counter (so
// refilling the storage never trips autograd's check on tensors it saved).
at::Tensor tensor_over(const c10::Storage& storage, int64_t offset, at::IntArrayRef sizes,
                       at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype));
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * sizes[i + 1];
  t.set_(storage, offset, sizes, strides);
  return t;
}

struct Param {
  std::string name;
  at::Tensor param;  // the module's registered parameter; its data is swapped, never the object
  std::vector<int64_t> shape;
  int64_t d0 = 1, row = 1, rows_per_shard = 1, shard_numel = 1, offset = 0;
  at::Tensor shard;  // leaf [rows_per_shard, ...] over the unit's flat shard
};

}  // namespace

struct Unit;

struct ShardingEngine::Impl {
  std::shared_ptr<Model> model;
  EngineComms comms;
  EngineOptions options;
  int shard_size = 1, shard_rank = 0;
  std::vector<std::unique_ptr<Unit>> units;  // root first
  UnitPlan plan;
  bool sync = true;
  // Each forward is a generation; its hooks and autograd nodes carry it, so a backward that
  // reaches an earlier forward's graph, or a second backward over one forward, is refused.
  uint64_t generation = 0, finished_generation = 0;
  bool in_backward = false;       // a backward of `generation` has started and not finished
  bool awaiting_backward = false; // the last forward's output needs a backward
  std::vector<Unit*> forward_order, last_forward_order;

  void prefetch_after(Unit* u, const std::vector<Unit*>& order);
  void finish_backward();
  // Brings every unit back to rest after a forward without backward or a failed backward:
  // pending gathers and reductions waited for and dropped, parameters resharded; with
  // drop_grads, unsharded gradients discarded too.
  void abort_step(bool drop_grads);
  void check_generation(uint64_t gen, const std::string& unit) const;
};

namespace {

struct PostBackward;

}  // namespace

struct Unit final : UnitHooks {
  ShardingEngine::Impl* engine = nullptr;
  std::string fqn;
  torch::nn::Module* module = nullptr;
  bool root = false;
  bool checkpoint = false;  // recompute activations in backward instead of storing them
  std::function<at::Tensor(const std::vector<at::Tensor>&)> recompute;  // this step's forward
  uint64_t recompute_generation = 0;
  std::vector<int64_t> recompute_slots;  // which of the forward's tensor arguments were defined
  size_t recompute_arity = 0;            // how many tensor arguments it has
  at::Tensor recompute_rng;              // the CPU generator's state when the forward ran
  std::vector<Param> params;
  int64_t total = 0;  // shard elements (padded)
  at::Tensor flat_shard, flat_grad;
  c10::Storage unsharded;      // shard_size * total elements while gathered (shard_size > 1)
  at::Tensor unsharded_flat;   // over `unsharded`, for the copy-out
  enum class State { Sharded, Gathering, Unsharded } state = State::Sharded;
  Work gather_work;
  at::Tensor gather_out;
  Work reduce_work;
  Work replicate_work;  // hybrid: the all-reduce across replicas, in flight after finish_reduce
  bool replicating = false;
  at::Tensor reduce_in, reduce_out;
  at::Tensor gather_in;
  int forward_calls = 0;
  bool pre_backward_done = false, post_backward_done = false, reduced = false;

  bool sharded_layout() const { return engine->shard_size > 1; }
  // Whether the gathered parameters live in storage of their own (sharded, or computed in
  // another dtype than stored); otherwise they are the shards themselves.
  bool separate() const { return sharded_layout() || engine->options.precision.compute != engine->options.precision.storage; }
  bool reshard_after_forward() const { return sharded_layout() && !root && engine->options.layout.reshard_after_forward; }

  void start_gather() {
    if (state != State::Sharded) return;
    state = State::Gathering;
    if (!sharded_layout()) return;
    // Cast before the all-gather: a bf16 compute dtype halves the bytes on the wire.
    const auto compute = engine->options.precision.compute;
    gather_in = flat_shard.scalar_type() == compute ? flat_shard : flat_shard.to(compute);
    gather_out = at::empty({engine->shard_size * total}, gather_in.options());
    gather_work = engine->comms.shard->all_gather(gather_out, gather_in);
  }

  void unshard() {
    if (state == State::Unsharded) return;
    start_gather();
    if (separate()) {
      const int64_t s = engine->shard_size;
      at::Tensor src;
      if (sharded_layout()) {
        gather_work.wait();
        src = gather_out.view({s, total});
      } else {
        src = flat_shard.view({1, total});  // cast below
      }
      resize_storage(unsharded, static_cast<size_t>(s * total) * unsharded_flat.element_size());
      at::NoGradGuard no_grad;
      for (const Param& p : params) {
        unsharded_flat.narrow(0, s * p.offset, s * p.shard_numel)
            .view({s, p.shard_numel})
            .copy_(src.narrow(1, p.offset, p.shard_numel));
      }
      gather_out = at::Tensor();
      gather_in = at::Tensor();
    }
    state = State::Unsharded;
  }

  void reshard() {
    if (!separate() || state != State::Unsharded) return;
    resize_storage(unsharded, 0);
    state = State::Sharded;
  }

  // Reduce-scatter (or, unsharded, all-reduce) of this unit's gradients into flat_grad; async.
  void reduce_grads() {
    at::NoGradGuard no_grad;
    const int64_t s = engine->shard_size;
    reduce_in = at::zeros({s * total}, flat_grad.options().dtype(engine->options.precision.reduce));
    at::Tensor dst = reduce_in.view({s, total});
    for (Param& p : params) {
      at::Tensor g = p.param.grad();
      if (!g.defined()) continue;
      at::Tensor flat = g.reshape({-1});
      for (int64_t r = 0; r < s; ++r) {
        int64_t rows = std::min(p.rows_per_shard, p.d0 - r * p.rows_per_shard);
        if (rows <= 0) break;
        dst[r].narrow(0, p.offset, rows * p.row).copy_(flat.narrow(0, r * p.rows_per_shard * p.row, rows * p.row));
      }
      p.param.mutable_grad() = at::Tensor();
    }
    if (sharded_layout()) {
      // Straight into the gradient shard when the dtypes agree; else through a reduce-dtype buffer.
      reduce_out = reduce_in.scalar_type() == flat_grad.scalar_type() ? flat_grad
                                                                      : at::empty({total}, reduce_in.options());
      reduce_work = engine->comms.shard->reduce_scatter(reduce_out, reduce_in, ReduceOp::Avg);
    } else {
      flat_grad.copy_(reduce_in);
      reduce_in = at::Tensor();
      if (engine->comms.replicate) reduce_work = engine->comms.replicate->all_reduce(flat_grad, ReduceOp::Avg);
    }
    reduced = true;
  }

  void finish_reduce() {
    if (!reduced) return;
    reduce_work.wait();
    reduce_in = at::Tensor();
    if (reduce_out.defined() && !reduce_out.is_same(flat_grad)) {
      at::NoGradGuard no_grad;
      flat_grad.copy_(reduce_out);
    }
    reduce_out = at::Tensor();
    // Hybrid: the shard's gradients across the replicas, asynchronously, so that this unit's
    // all-reduce overlaps the next units' reduce-scatters (finish_replicate waits).
    if (sharded_layout() && engine->comms.replicate)
    {
      replicate_work = engine->comms.replicate->all_reduce(flat_grad, ReduceOp::Avg);
      replicating = true;
    }
    reduced = false;
  }

  void finish_replicate() {
    if (!replicating) return;
    replicating = false;
    replicate_work.wait();
    replicate_work = Work();
  }

  std::vector<at::Tensor> pre_forward(std::vector<at::Tensor> inputs) override;
  at::Tensor post_forward(at::Tensor output) override;
  at::Tensor run(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                 const std::vector<at::Tensor>& inputs) override;
  bool recomputes() const override { return checkpoint && at::GradMode::is_enabled(); }
  // The forward's tensor arguments from the defined ones (undefined where they were).
  std::vector<at::Tensor> arguments(const std::vector<at::Tensor>& defined) const {
    std::vector<at::Tensor> out(recompute_arity);
    for (size_t k = 0; k < recompute_slots.size() && k < defined.size(); ++k)
      out[static_cast<size_t>(recompute_slots[k])] = defined[k];
    return out;
  }
  void drop_recompute() {
    recompute = nullptr;
    recompute_slots.clear();
    recompute_rng = at::Tensor();
  }

  void pre_backward(uint64_t gen) {
    engine->check_generation(gen, fqn);
    if (pre_backward_done) return;
    pre_backward_done = true;
    if (!engine->in_backward) {
      engine->in_backward = true;
      ShardingEngine::Impl* e = engine;
      torch::autograd::Engine::get_default_engine().queue_callback([e, gen] {
        if (e->generation == gen && e->in_backward) e->finish_backward();
      });
    }
    unshard();
    if (engine->options.overlap) {
      std::vector<Unit*> reverse(engine->last_forward_order.rbegin(), engine->last_forward_order.rend());
      engine->prefetch_after(this, reverse);
    }
  }

  void post_backward(uint64_t gen) {
    engine->check_generation(gen, fqn);
    post_backward();
  }

  void post_backward() {
    if (post_backward_done) return;
    post_backward_done = true;
    if (engine->sync) reduce_grads();
    reshard();
  }

  void begin_step() {
    drop_recompute();
    forward_calls = 0;
    pre_backward_done = post_backward_done = false;
  }
};

namespace {

// The identity on a unit's inputs. Its backward runs once the unit's backward has produced the
// gradients of its inputs, after its parameters' gradients were accumulated: post-backward.
// (The inputs travel as at::TensorList: LibTorch's custom functions take a std::vector of
// tensors for a plain argument, and the outputs would then have no history.)
struct PostBackward : public torch::autograd::Function<PostBackward> {
  static variable_list forward(AutogradContext* ctx, int64_t unit, int64_t generation, at::TensorList inputs) {
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["generation"] = generation;
    variable_list out;
    for (const auto& t : inputs) out.push_back(t.view_as(t));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    reinterpret_cast<Unit*>(ctx->saved_data["unit"].toInt())
        ->post_backward(static_cast<uint64_t>(ctx->saved_data["generation"].toInt()));
    variable_list out{at::Tensor(), at::Tensor()};
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  }
};

}  // namespace

std::vector<at::Tensor> Unit::pre_forward(std::vector<at::Tensor> inputs) {
  if (forward_calls++ > 0)
    throw Error("unit '" + fqn + "' ran its forward twice in one step; fsdpx gathers and reduces a unit once per "
                "step, so a layer called twice must not be a unit (wrap its parent instead)");
  engine->forward_order.push_back(this);
  const PrecisionSpec& prec = engine->options.precision;
  if (prec.cast_forward_inputs)
    for (auto& t : inputs)
      if (t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != prec.compute) t = t.to(prec.compute);
  unshard();
  if (engine->options.overlap) engine->prefetch_after(this, engine->last_forward_order);
  if (!at::GradMode::is_enabled()) return inputs;
  std::vector<size_t> idx;
  variable_list needs;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      idx.push_back(i);
      needs.push_back(inputs[i]);
    }
  if (needs.empty()) return inputs;
  variable_list wrapped = PostBackward::apply(reinterpret_cast<int64_t>(this), static_cast<int64_t>(engine->generation),
                                             at::TensorList(needs));
  for (size_t k = 0; k < idx.size(); ++k) inputs[idx[k]] = wrapped[k];
  return inputs;
}

// Activation checkpointing of one unit. Forward runs the unit's forward without recording a
// graph and keeps only its inputs; backward (after the unit's pre-backward has gathered its
// parameters again) runs the forward once more with a graph and differentiates it, returning
// the inputs' gradients and the parameters' (which autograd accumulates into their .grad as
// usual, so the unit's post-backward reduces them). The parameters are arguments so that the
// output has a history even when no input needs a gradient.
struct Recompute : public torch::autograd::Function<Recompute> {
  // `all` = the defined tensor arguments (Unit::recompute_slots says where they go), then the
  // unit's parameters.
  static at::Tensor forward(AutogradContext* ctx, int64_t unit, int64_t generation, int64_t num_inputs, at::TensorList all) {
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["generation"] = generation;
    ctx->saved_data["num_inputs"] = num_inputs;
    std::vector<at::Tensor> defined(all.begin(), all.begin() + num_inputs);
    c10::List<bool> needs;
    for (const auto& t : defined) needs.push_back(t.requires_grad());
    ctx->saved_data["needs"] = needs;
    ctx->save_for_backward(defined);
    Unit* u = reinterpret_cast<Unit*>(unit);
    {
      // The generator's state, so that the recompute draws the same random numbers (dropout).
      at::CPUGeneratorImpl* gen = at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
      std::lock_guard<std::mutex> lock(gen->mutex_);
      u->recompute_rng = at::Tensor(gen->get_state());
    }
    at::NoGradGuard no_grad;
    return u->recompute(u->arguments(defined));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Unit* u = reinterpret_cast<Unit*>(ctx->saved_data["unit"].toInt());
    const auto gen = static_cast<uint64_t>(ctx->saved_data["generation"].toInt());
    const int64_t n = ctx->saved_data["num_inputs"].toInt();
    c10::List<bool> needs = ctx->saved_data["needs"].toBoolList();
    u->pre_backward(gen);  // the parameters, gathered again (a no-op when the output hook did it)
    if (u->recompute_generation != gen || !u->recompute)
      throw Error("unit '" + u->fqn + "': the forward to recompute belongs to another step");
    std::vector<at::Tensor> saved = ctx->get_saved_variables(), defined;
    variable_list wrt;
    std::vector<int64_t> input_slot;
    for (int64_t i = 0; i < n; ++i) {
      at::Tensor x = saved[static_cast<size_t>(i)].detach().requires_grad_(needs.get(static_cast<size_t>(i)));
      defined.push_back(x);
      if (needs.get(static_cast<size_t>(i))) {
        input_slot.push_back(i);
        wrt.push_back(x);
      }
    }
    std::vector<size_t> param_slot;
    for (size_t k = 0; k < u->params.size(); ++k)
      if (u->params[k].param.requires_grad()) {
        param_slot.push_back(k);
        wrt.push_back(u->params[k].param);
      }
    at::Tensor out;
    {
      at::CPUGeneratorImpl* cpu = at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
      at::Tensor now;
      {
        std::lock_guard<std::mutex> lock(cpu->mutex_);
        now = at::Tensor(cpu->get_state());
        cpu->set_state(*u->recompute_rng.unsafeGetTensorImpl());
      }
      at::AutoGradMode enable(true);
      try {
        out = u->recompute(u->arguments(defined));
      } catch (...) {
        std::lock_guard<std::mutex> lock(cpu->mutex_);
        cpu->set_state(*now.unsafeGetTensorImpl());
        throw;
      }
      std::lock_guard<std::mutex> lock(cpu->mutex_);
      cpu->set_state(*now.unsafeGetTensorImpl());
    }
    variable_list g = wrt.empty() ? variable_list{}
                                  : torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false,
                                                          /*create_graph=*/false, /*allow_unused=*/true);
    variable_list result(static_cast<size_t>(3 + n + static_cast<int64_t>(u->params.size())));
    for (size_t j = 0; j < input_slot.size(); ++j) result[static_cast<size_t>(3 + input_slot[j])] = g[j];
    for (size_t j = 0; j < param_slot.size(); ++j) result[3 + static_cast<size_t>(n) + param_slot[j]] = g[input_slot.size() + j];
    u->drop_recompute();
    return result;
  }
};

at::Tensor Unit::run(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f, const std::vector<at::Tensor>& inputs) {
  if (!recomputes()) {
    drop_recompute();
    return f(inputs);
  }
  recompute = f;
  recompute_generation = engine->generation;
  recompute_arity = inputs.size();
  recompute_slots.clear();
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined()) {
      recompute_slots.push_back(static_cast<int64_t>(i));
      all.push_back(inputs[i]);
    }
  const auto n = static_cast<int64_t>(all.size());
  for (const Param& p : params) all.push_back(p.param);
  return Recompute::apply(reinterpret_cast<int64_t>(this), static_cast<int64_t>(engine->generation), n, at::TensorList(all));
}

at::Tensor Unit::post_forward(at::Tensor output) {
  if (reshard_after_forward()) reshard();
  const auto& out_dtype = engine->options.precision.output;
  if (root && out_dtype && output.defined() && at::isFloatingType(output.scalar_type()) &&
      output.scalar_type() != *out_dtype)
    output = output.to(*out_dtype);
  if (at::GradMode::is_enabled() && output.defined() && output.requires_grad()) {
    const uint64_t gen = engine->generation;
    output.register_hook([this, gen](const at::Tensor& grad) {
      pre_backward(gen);
      return grad;
    });
  }
  return output;
}

void ShardingEngine::Impl::prefetch_after(Unit* u, const std::vector<Unit*>& order) {
  auto it = std::find(order.begin(), order.end(), u);
  if (it == order.end()) return;
  int issued = 0;
  for (++it; it != order.end() && issued < options.prefetch; ++it) {
    if ((*it)->post_backward_done) continue;  // already through its backward
    if ((*it)->state == Unit::State::Sharded) (*it)->start_gather();
    ++issued;
  }
}

void ShardingEngine::Impl::check_generation(uint64_t gen, const std::string& unit) const {
  const std::string name = unit.empty() ? "the root" : "unit '" + unit + "'";
  if (gen != generation)
    throw Error("backward reached " + name + " of an earlier forward: fsdpx needs each forward's backward before the "
                "next forward (for gradient accumulation, run forward and backward per micro-batch with "
                "set_requires_gradient_sync(false))");
  if (gen == finished_generation)
    throw Error("a second backward reached " + name + " of the same forward: fsdpx gathers and reduces each unit "
                "once per forward; run forward again");
}

void ShardingEngine::Impl::finish_backward() {
  // Units whose post-backward did not fire (inputs that need no gradient, such as token ids,
  // and the root), latest first.
  for (auto it = units.rbegin(); it != units.rend(); ++it) (*it)->post_backward();
  if (sync) {
    for (auto& u : units) u->finish_reduce();
    for (auto& u : units) u->finish_replicate();
  }
  abort_step(/*drop_grads=*/false);  // gathers prefetched for units whose backward never came
  finished_generation = generation;
  in_backward = false;
  awaiting_backward = false;
}

void ShardingEngine::Impl::abort_step(bool drop_grads) {
  for (auto& u : units) {
    if (u->state == Unit::State::Gathering) {
      try {
        u->gather_work.wait();
      } catch (const std::exception&) {
        // the step is being abandoned; the failure was or will be reported by the collective
      }
      u->gather_out = at::Tensor();
      u->gather_in = at::Tensor();
      u->state = Unit::State::Sharded;
    }
    if (u->reduced) {
      try {
        u->reduce_work.wait();
      } catch (const std::exception&) {
      }
      u->reduce_in = at::Tensor();
      u->reduce_out = at::Tensor();
      u->reduced = false;
    }
    if (u->replicating) {
      try {
        u->finish_replicate();
      } catch (const std::exception&) {
      }
      u->replicating = false;
    }
    u->drop_recompute();  // a forward whose backward never came: let its graph go
    u->reshard();
    if (drop_grads)
      for (auto& p : u->params) p.param.mutable_grad() = at::Tensor();
  }
  in_backward = false;
  awaiting_backward = false;
}

// ---- Construction ------------------------------------------------------------------------------

namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

ShardingEngine::ShardingEngine(std::shared_ptr<Model> model, const std::vector<UnitSelection>& selected,
                               EngineComms comms, EngineOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& e = *impl_;
  e.model = std::move(model);
  e.comms = std::move(comms);
  e.options = options;
  const ShardingLayout& layout = options.layout;
  const int world = e.comms.world ? e.comms.world->size() : 1;
  if (layout.shard_group_size * layout.replicate_group_size != world)
    throw Error("sharding layout " + std::to_string(layout.shard_group_size) + " (shard) x " +
                std::to_string(layout.replicate_group_size) + " (replicate) does not cover the world of " +
                std::to_string(world) + " ranks");
  if ((layout.shard_group_size > 1) != static_cast<bool>(e.comms.shard) ||
      (e.comms.shard && e.comms.shard->size() != layout.shard_group_size) ||
      (layout.replicate_group_size > 1) != static_cast<bool>(e.comms.replicate) ||
      (e.comms.replicate && e.comms.replicate->size() != layout.replicate_group_size))
    throw Error("the engine's communicators do not match the sharding layout (a bug in the host)");
  if (options.prefetch < 1) throw Error("prefetch must be at least 1, got " + std::to_string(options.prefetch));
  // CPU offload: this engine computes on the CPU, where the shards, gradients and optimizer
  // state already live in host memory; there is nothing to move (the trainer says so).
  e.shard_size = layout.shard_group_size;
  e.shard_rank = e.comms.shard ? e.comms.shard->rank() : 0;

  std::shared_ptr<torch::nn::Module> root = e.model->module();
  if (!root) throw Error("the model has no module");

  // Which module is which unit; every module once.
  std::map<std::string, bool> chosen;
  for (const auto& s : selected) {
    if (s.fqn.empty()) throw Error("the wrap policy selected the root; the root is always a unit and is not listed");
    if (!chosen.emplace(s.fqn, s.activation_checkpoint).second)
      throw Error("the wrap policy selected '" + s.fqn + "' twice");
  }
  std::map<const torch::nn::Module*, std::string> seen_modules;
  std::map<const c10::TensorImpl*, std::pair<std::string, std::string>> seen_params;  // -> (param, unit)
  std::vector<std::string> all_fqns;
  e.units.push_back(std::make_unique<Unit>());
  e.units[0]->engine = &e;
  e.units[0]->root = true;
  e.units[0]->module = root.get();

  std::function<void(torch::nn::Module&, const std::string&, Unit*)> walk = [&](torch::nn::Module& m, const std::string& fqn,
                                                                                Unit* unit) {
    auto [it, fresh] = seen_modules.emplace(&m, fqn);
    if (!fresh)
      throw Error("module '" + fqn + "' is the same object as '" + it->second +
                  "'; a module reachable from two places cannot be sharded (its parameters would belong to two units)");
    if (!fqn.empty()) all_fqns.push_back(fqn);
    if (!fqn.empty() && chosen.count(fqn)) {
      if (!is_wrappable(m))
        throw Error("unit '" + fqn + "' is a " + m.name() +
                    ", which fsdpx cannot hook: only layers declared with FSDPX_MODULE (fsdpx/unit.h) can be units; "
                    "this model's wrappable layer types: " + join_names(e.model->layer_types()));
      if (unit->checkpoint)
        throw Error("unit '" + fqn + "' is inside '" + unit->fqn +
                    "', whose activations are recomputed in backward; a recomputed unit cannot hold other units "
                    "(recompute the inner layer type instead, or do not make it a unit)");
      e.units.push_back(std::make_unique<Unit>());
      unit = e.units.back().get();
      unit->engine = &e;
      unit->fqn = fqn;
      unit->module = &m;
      unit->checkpoint = chosen[fqn];
    }
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      const std::string name = fqn.empty() ? p.key() : fqn + "." + p.key();
      const at::Tensor& t = p.value();
      if (!t.defined()) continue;
      if (t.scalar_type() != at::kFloat)
        throw Error("parameter '" + name + "' is " + std::string(c10::toString(t.scalar_type())) +
                    "; the engine keeps fp32 parameters (other dtypes come through a precision policy)");
      auto [pit, new_param] = seen_params.emplace(t.unsafeGetTensorImpl(), std::make_pair(name, unit->fqn));
      if (!new_param) {
        if (pit->second.second != unit->fqn)
          throw Error("parameter '" + name + "' is the same tensor as '" + pit->second.first +
                      "', but they are in different units ('" + unit->fqn + "' and '" + pit->second.second +
                      "'); shared parameters must stay in one unit: wrap a module that holds both");
        continue;  // tied within one unit: one shard serves both names
      }
      Param q;
      q.name = name;
      q.param = t;
      q.shape = t.sizes().vec();
      unit->params.push_back(std::move(q));
    }
    for (const auto& c : m.named_children())
      walk(*c.value(), fqn.empty() ? c.key() : fqn + "." + c.key(), unit);
  };
  walk(*root, "", e.units[0].get());
  for (const auto& [fqn, ckpt] : chosen) {
    (void)ckpt;
    if (std::find(all_fqns.begin(), all_fqns.end(), fqn) == all_fqns.end())
      throw Error("the wrap policy selected '" + fqn + "', which is not a submodule of the model" + did_you_mean(fqn, all_fqns));
  }
  if (seen_params.empty()) throw Error("the model has no parameters: there is nothing to shard or train");

  // Every rank must have built the same model: compare a checksum of names and shapes.
  // Every rank must also run the same collectives: the layout and the overlap settings count.
  uint64_t checksum = parameter_seed(options.seed, "layout/" + std::to_string(layout.shard_group_size) + "x" +
                                                       std::to_string(layout.replicate_group_size) + "/" +
                                                       std::to_string(layout.reshard_after_forward) + "/" +
                                                       std::to_string(options.overlap) + "/" +
                                                       std::to_string(options.prefetch) + "/" +
                                                       c10::toString(options.precision.storage) + "/" +
                                                       c10::toString(options.precision.compute) + "/" +
                                                       c10::toString(options.precision.reduce));
  for (const auto& u : e.units)
    for (const auto& p : u->params) {
      checksum = parameter_seed(checksum, p.name + shape_str(p.shape) + "@" + u->fqn);
    }
  if (e.comms.world && e.comms.world->size() > 1) {
    const int n = e.comms.world->size();
    at::Tensor mine = at::full({1}, static_cast<int64_t>(checksum & 0x7fffffffffffffffULL), at::kLong);
    at::Tensor all = at::empty({n}, at::kLong);
    e.comms.world->all_gather(all, mine).wait();
    std::vector<int> differ;
    for (int r = 0; r < n; ++r)
      if (all[r].item<int64_t>() != all[0].item<int64_t>()) differ.push_back(r);
    if (!differ.empty()) {
      std::string ranks;
      for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      throw Error("the model differs between ranks: the parameter names and shapes, the units, the sharding layout or "
                  "the overlap settings of rank(s) " + ranks +
                  " do not match rank 0's; every rank must build the same model with the same options");
    }
  }

  // Shard layout, storage, and world-size-invariant initialisation, one parameter at a time.
  const int64_t S = e.shard_size;
  for (auto& up : e.units) {
    Unit& u = *up;
    for (Param& p : u.params) {
      p.d0 = p.shape.empty() ? 1 : p.shape[0];
      p.row = p.shape.empty() ? 1 : numel_of(std::vector<int64_t>(p.shape.begin() + 1, p.shape.end()));
      p.rows_per_shard = (p.d0 + S - 1) / S;
      if (p.d0 == 0) p.rows_per_shard = 0;
      p.shard_numel = p.rows_per_shard * p.row;
      p.offset = u.total;
      u.total += p.shard_numel;
    }
    const PrecisionSpec& prec = options.precision;
    const auto opts = at::TensorOptions().dtype(at::kFloat);
    u.flat_shard = at::zeros({u.total}, opts.dtype(prec.storage));
    u.flat_grad = at::zeros({u.total}, opts.dtype(prec.gradient));
    if (u.separate()) {
      u.unsharded = c10::Storage(c10::Storage::use_byte_size_t(),
                                 static_cast<size_t>(S * u.total) * c10::elementSize(prec.compute),
                                 c10::GetAllocator(at::kCPU), /*resizable=*/true);
      u.unsharded_flat = tensor_over(u.unsharded, 0, {S * u.total}, prec.compute);
    }
    for (Param& p : u.params) {
      std::vector<int64_t> shard_shape = p.shape.empty() ? std::vector<int64_t>{1} : p.shape;
      shard_shape[0] = p.rows_per_shard;
      {
        at::NoGradGuard no_grad;
        p.shard = tensor_over(u.flat_shard.storage(), p.offset, shard_shape, prec.storage);
        // A frozen parameter stays frozen (no gradient view); a trainable one sees its slice of
        // the unit's flat gradient (zeros where no rank produced a gradient).
        if (p.param.requires_grad()) {
          p.shard.requires_grad_(true);
          p.shard.mutable_grad() = tensor_over(u.flat_grad.storage(), p.offset, shard_shape, prec.gradient);
        }
        // The whole parameter exists only for this moment.
        at::Tensor full = at::empty(p.shape, opts);
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(options.seed, p.name));
        e.model->init_parameter(p.name, full, gen);
        at::Tensor rows = full.reshape({p.d0, p.row});
        int64_t first = e.shard_rank * p.rows_per_shard;
        int64_t mine = std::max<int64_t>(0, std::min(p.rows_per_shard, p.d0 - first));
        if (mine > 0) p.shard.view({p.rows_per_shard, p.row}).narrow(0, 0, mine).copy_(rows.narrow(0, first, mine));
      }
      // The module's parameter becomes a view of the unit's unsharded storage (or, unsharded,
      // of the shard itself); its object stays, so the model and autograd keep using it.
      at::Tensor view = u.separate() ? tensor_over(u.unsharded, S * p.offset, p.shape, prec.compute)
                                     : tensor_over(u.flat_shard.storage(), p.offset, p.shape, prec.storage);
      p.param.set_data(view);
    }
    if (u.separate()) resize_storage(u.unsharded, 0);
  }
  // Module buffers in the precision's buffer dtype (floating ones; they are not sharded).
  if (options.precision.buffer) {
    at::NoGradGuard no_grad;
    for (auto& b : root->buffers())
      if (b.defined() && at::isFloatingType(b.scalar_type()) && b.scalar_type() != *options.precision.buffer)
        b.set_data(b.to(*options.precision.buffer));
  }
  // Hook the units only now that nothing can fail, all at once.
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (auto& u : e.units)
      if (!u->root && installed_hooks().count(u->module))
        throw Error("unit '" + u->fqn + "' is already a unit of another live ShardingEngine; one model, one engine");
    for (auto& u : e.units)
      if (!u->root) installed_hooks()[u->module] = u.get();
  }
  // The plan, in the form wrap policies print it.
  std::vector<UnitSelection> sel;
  for (size_t i = 1; i < e.units.size(); ++i) sel.push_back({e.units[i]->fqn, chosen[e.units[i]->fqn]});
  e.plan = plan_units(*root, sel);
}

ShardingEngine::~ShardingEngine() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (auto& u : impl_->units) {
    auto it = installed_hooks().find(u->module);
    if (!u->root && it != installed_hooks().end() && it->second == u.get()) installed_hooks().erase(it);
  }
}

at::Tensor ShardingEngine::forward(const std::function<at::Tensor()>& f) {
  Impl& e = *impl_;
  // A forward whose backward never came (validation with grad on, a skipped step), or a
  // backward that failed half-way: bring everything back to rest. Everything is resharded, the
  // root too, so that the new forward gathers what the optimizer last wrote.
  if (e.in_backward) e.abort_step(/*drop_grads=*/true);
  if (e.awaiting_backward) e.abort_step(/*drop_grads=*/false);
  for (auto& u : e.units) {
    u->reshard();
    u->begin_step();
  }
  ++e.generation;
  e.forward_order.clear();
  Unit& root = *e.units[0];
  root.pre_forward({});
  at::Tensor out = f();
  out = root.post_forward(out);
  for (auto& u : e.units)
    if (!u->root && !u->params.empty() && u->forward_calls == 0)
      throw Error("unit '" + u->fqn + "' did not run in this forward; call it through its FSDPX_MODULE holder (`layer(x)`), "
                  "not layer->forward(x)");
  e.last_forward_order = e.forward_order;
  if (!at::GradMode::is_enabled() || !out.requires_grad()) {
    for (auto& u : e.units) u->reshard();  // no backward will follow
  } else {
    e.awaiting_backward = true;
  }
  return out;
}

void ShardingEngine::backward(const at::Tensor& loss) {
  Impl& e = *impl_;
  try {
    loss.backward();
    // The final callback did not run: no unit's hook fired (the loss does not depend on them).
    if (e.awaiting_backward && e.finished_generation != e.generation) e.finish_backward();
  } catch (...) {
    e.abort_step(/*drop_grads=*/true);
    throw;
  }
}

void ShardingEngine::set_requires_gradient_sync(bool sync) { impl_->sync = sync; }

double ShardingEngine::clip_grad_norm(double max_norm) {
  Impl& e = *impl_;
  at::Tensor sq = at::zeros({1}, at::kDouble);
  for (auto& u : e.units) sq += u->flat_grad.to(at::kDouble).pow(2).sum();
  if (e.comms.shard) e.comms.shard->all_reduce(sq, ReduceOp::Sum).wait();
  const double norm = std::sqrt(sq.item<double>());
  const double scale = max_norm / (norm + 1e-6);
  if (scale < 1.0) {
    at::NoGradGuard no_grad;
    for (auto& u : e.units) u->flat_grad.mul_(scale);
  }
  return norm;
}

std::vector<ParamShard> ShardingEngine::shards() const {
  std::vector<ParamShard> out;
  for (auto& u : impl_->units)
    for (auto& p : u->params) out.push_back({p.name, p.shard});
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ShardingEngine::full_parameters() {
  Impl& e = *impl_;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& u : e.units) {
    at::Tensor all = u->flat_shard;
    if (e.shard_size > 1) {
      all = at::empty({e.shard_size * u->total}, u->flat_shard.options());
      e.comms.shard->all_gather(all, u->flat_shard).wait();
    }
    at::Tensor grid = all.view({e.shard_size, u->total});
    for (auto& p : u->params) {
      at::Tensor full = grid.narrow(1, p.offset, p.shard_numel).reshape({e.shard_size * p.rows_per_shard, p.row});
      out.emplace_back(p.name, full.narrow(0, 0, p.d0).reshape(p.shape).clone());
    }
  }
  return out;
}

const UnitPlan& ShardingEngine::plan() const { return impl_->plan; }
int ShardingEngine::shard_rank() const { return static_cast<int>(impl_->shard_rank); }
int ShardingEngine::shard_size() const { return static_cast<int>(impl_->shard_size); }
int ShardingEngine::replicate_rank() const { return impl_->comms.replicate ? impl_->comms.replicate->rank() : 0; }

MemoryReport ShardingEngine::memory() const {
  MemoryReport m;
  for (auto& u : impl_->units) {
    m.param_bytes += static_cast<int64_t>(u->flat_shard.storage().nbytes());
    m.grad_bytes += static_cast<int64_t>(u->flat_grad.storage().nbytes());
    if (u->separate()) m.unsharded_bytes += static_cast<int64_t>(u->unsharded.nbytes());
  }
  return m;
}

std::vector<int64_t> ShardingEngine::unit_shard_numels() const {
  std::vector<int64_t> out;
  for (auto& u : impl_->units) out.push_back(u->total);
  return out;
}

std::vector<bool> ShardingEngine::unit_reshards_after_forward() const {
  std::vector<bool> out;
  for (auto& u : impl_->units) out.push_back(u->reshard_after_forward());
  return out;
}

}  // namespace fsdpx
