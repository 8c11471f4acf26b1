// fsdpx::fully_shard (fsdpx/framework/trainer/fully_shard.h): the user's module behind the SDK's
// Model interface, so that the library and fsdpx-train build one ShardingEngine the same way
// (plugins by name, engine_comms, select_units).
#include "fsdpx/fully_shard.h"

#include <algorithm>
#include <exception>
#include <utility>
#include <cstdio>

#define XXH_INLINE_ALL  // header-only: libxxhash-dev's xxhash.h
#include <xxhash.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "comm_counters.h"
#include "engine_comms.h"
#include "fsdpx/error.h"
#include "fsdpx/framework/base/dtype_name.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/framework/runtime/cpu_resources.h"
#include "fsdpx/framework/trainer/checkpoint_saver.h"
#include "fsdpx/framework/trainer/checkpoint_state.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/every_rank.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/framework/runtime/topology_resolver.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/unit.h"
#include "fsdpx/model.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/suggest.h"
#include "fsdpx/sharding_strategy.h"
#include "fsdpx/wrap_policy.h"
#include "torch_optimizer_state.h"
#include "trainer_state.h"

namespace fsdpx {

struct Runtime::Impl {
  ResolvedTopology topology;
  std::shared_ptr<DeviceRuntime> device;
  std::shared_ptr<ProcessGroups> groups;
  PluginHost host;
};

namespace {

// A module the user built and initialised: the engine's Model, whose parameters are their own values.
class ModuleModel final : public Model {
 public:
  explicit ModuleModel(std::shared_ptr<torch::nn::Module> module) : module_(std::move(module)) {
    for (const auto& p : module_->named_parameters(/*recurse=*/true)) {
      const at::Tensor& t = p.value();
      if (t.numel() > 0 && (!t.has_storage() || t.storage().nbytes() == 0))
        throw Error("fully_shard: parameter '" + p.key() + "' has no values (an fsdpx::deferred_tensor?): the "
                    "module overload shards parameters the module has materialised; a model built with deferred "
                    "parameters goes to fully_shard as a Model (fsdpx/model.h)");
      values_[p.key()] = t;
      const at::Tensor c = t.detach().to(at::kCPU).contiguous();
      digests_[p.key()] = static_cast<int64_t>(XXH3_64bits(c.data_ptr(), c.nbytes()) & 0x7fffffffffffffffULL);
    }
  }
  std::shared_ptr<torch::nn::Module> module() override { return module_; }
  void init_parameter(const std::string& name, at::Tensor& param, at::Generator&) const override {
    const auto it = values_.find(name);
    if (it == values_.end())
      throw Error("fully_shard: the engine asked for parameter '" + name + "', which the module lacks");
    at::NoGradGuard no_grad;
    param.copy_(it->second);
  }
  // Each parameter's XXH3 digest of its values as the module had them.
  const std::map<std::string, int64_t>& digests() const { return digests_; }
  // The engine's parameter values are taken: the module's own storages are the engine's from now on.
  void forget_values() { values_.clear(); }
  at::Tensor loss(const Batch&) override {
    throw Error("fully_shard: the loss is the caller's (ShardedModule::forward runs it)");
  }
  std::vector<std::string> layer_types() const override {
    std::vector<std::string> types;
    for (const auto& m : module_->named_modules("", /*include_self=*/false)) {
      const std::string t = layer_type_name(*m.value());
      if (is_wrappable(*m.value()) && std::find(types.begin(), types.end(), t) == types.end()) types.push_back(t);
    }
    return types;
  }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::map<std::string, at::Tensor> values_;
  std::map<std::string, int64_t> digests_;
};

// Each rank keeps its rows of its own copy of the module: ranks whose values differ (built with
// different seeds) would train a mix of models. Every rank's digest of each parameter
// (ModuleModel::digests); the first parameter that differs is named, on every rank. Collective
// (the structure is already the same on every rank: the engine checked it).
void check_values_agree(const std::map<std::string, int64_t>& digests, Communicator& control) {
  if (control.size() <= 1) return;
  std::vector<int64_t> mine;
  for (const auto& [name, d] : digests) mine.push_back(d);
  const auto all = from_every_rank(control, mine);
  auto name = digests.begin();
  for (size_t i = 0; i < mine.size(); ++i, ++name) {
    std::vector<std::string> differ;
    for (size_t r = 1; r < all.size(); ++r)
      if (all[r][i] != all[0][i]) differ.push_back(std::to_string(r));
    if (!differ.empty())
      throw Error("fully_shard: the module's values differ between ranks: parameter '" + name->first + "' of rank(s) " +
                  join_names(differ) + " is not rank 0's; each rank keeps its rows of its own copy, so every rank "
                  "must build the module with the same values (torch::manual_seed with one seed before building it)");
  }
}

}  // namespace

Runtime::Runtime(RuntimeSettings settings) : impl_(std::make_unique<Impl>()) {
  const DeviceKind kind = device_kind(settings.device);
  impl_->topology = resolve_topology(TopologyFlags{}, process_environment());
  PluginSearch search;
  search.dirs = settings.plugin_dirs;
  impl_->host.discover(search);
  RuntimeOptions ro;
  ro.topology = impl_->topology.topology;
  ro.device = kind;
  ro.rendezvous_timeout = settings.rendezvous_timeout;
  ro.collective_timeout = settings.collective_timeout;
  ro.share_devices = settings.share_gpus || share_gpus_from_environment();
  check_device_trains(kind, Backend::Default, ro.topology.local_world_size, ro.share_devices);
  // LibTorch's intra-op threads: this rank's share of the cores (OMP_NUM_THREADS wins), as fsdpx-train's.
  at::set_num_threads(choose_threads(process_environment(), ro.topology.local_world_size, affinity_cpus()).threads);
  impl_->device = open_device(settings.device, ro.topology.local_rank);
  impl_->groups = ProcessGroups::create(ro);
}
Runtime::~Runtime() = default;
const Topology& Runtime::topology() const { return impl_->topology.topology; }
c10::Device Runtime::device() const { return impl_->device->device(); }
PluginHost& Runtime::plugins() const { return impl_->host; }
std::shared_ptr<Model> Runtime::create_model(const std::string& name,
                                             const std::map<std::string, std::string>& options) {
  return impl_->host.create<Model>(name, options);
}
double Runtime::mean_over_ranks(double value) const {
  const auto all = from_every_rank(*impl_->groups->control(), std::vector<double>{value});
  double sum = 0;
  for (const auto& v : all) sum += v.at(0);
  return sum / static_cast<double>(all.size());
}

ShardOptions::ShardOptions() {}
ShardOptions& ShardOptions::with_sharding(std::string name, std::map<std::string, std::string> options) {
  sharding = std::move(name);
  sharding_options = std::move(options);
  return *this;
}
ShardOptions& ShardOptions::with_wrap(std::string name, std::map<std::string, std::string> options) {
  wrap = std::move(name);
  wrap_options = std::move(options);
  return *this;
}
ShardOptions& ShardOptions::wrap_layer_types(const std::string& types) {
  wrap = "layer_type";
  wrap_options["layer_types"] = types;
  return *this;
}
ShardOptions& ShardOptions::with_precision(std::string name, std::map<std::string, std::string> options) {
  precision = std::move(name);
  precision_options = std::move(options);
  return *this;
}
ShardOptions& ShardOptions::with_overlap(bool on) {
  overlap = on;
  return *this;
}
ShardOptions& ShardOptions::with_prefetch(int units) {
  prefetch = units;
  return *this;
}
ShardOptions& ShardOptions::with_reshard_after_forward(const std::string& unit, ReshardAfterForward choice) {
  reshard_after_forward[unit] = choice;
  return *this;
}
ShardOptions& ShardOptions::with_activation_offload(const std::string& unit) {
  activation_offload.insert(unit);
  return *this;
}
ShardOptions& ShardOptions::with_seed(uint64_t value) {
  seed = value;
  return *this;
}

struct ShardedModule::Impl {
  Runtime::Impl& runtime;
  std::shared_ptr<Model> model;
  CommCounters counters;
  std::unique_ptr<ShardingEngine> engine;
  // Asynchronous saves: the backend they were made with (its name and options), and its saver.
  std::string saver_key;
  std::shared_ptr<CheckpointBackend> save_backend;
  std::unique_ptr<CheckpointSaver> saver;
};

ShardedModule::ShardedModule(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardedModule::~ShardedModule() {
  try {
    wait_for_save();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdpx: %s\n", e.what());
  }
}
at::Tensor ShardedModule::forward(const std::function<at::Tensor()>& f) { return impl_->engine->forward(f); }
void ShardedModule::backward(const at::Tensor& loss) { impl_->engine->backward(loss); }
void ShardedModule::set_requires_gradient_sync(bool sync) { impl_->engine->set_requires_gradient_sync(sync); }
double ShardedModule::clip_grad_norm(double max_norm) { return impl_->engine->clip_grad_norm(max_norm); }
void ShardedModule::zero_grad(bool set_to_none) {
  if (set_to_none) impl_->engine->release_gradients();
  else impl_->engine->zero_grad();
}
MemoryReport ShardedModule::memory() const { return impl_->engine->memory(); }
std::vector<ParamShard> ShardedModule::shards() const { return impl_->engine->shards(); }

FullParameters::FullParameters(std::map<std::string, at::Tensor> full, std::vector<TensorShard> rows, bool writable)
    : full_(std::move(full)),
      rows_(std::move(rows)),
      writable_(writable),
      pending_(writable),
      exceptions_at_start_(std::uncaught_exceptions()) {}

FullParameters::FullParameters(FullParameters&& other) noexcept
    : full_(std::move(other.full_)),
      rows_(std::move(other.rows_)),
      writable_(other.writable_),
      pending_(std::exchange(other.pending_, false)),
      exceptions_at_start_(other.exceptions_at_start_) {}

FullParameters::~FullParameters() {
  if (!pending_ || std::uncaught_exceptions() > exceptions_at_start_) return;  // unwinding: nothing written
  try {
    commit();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdpx: %s\n", e.what());
  }
}

void FullParameters::commit() {
  if (!writable_)
    throw Error("summon_full_params: these parameters are read-only; summon_full_params(/*writable=*/true) gives "
                "parameters to write back");
  for (const TensorShard& r : rows_) {  // every shape first: all or nothing
    const at::Tensor& t = full_.at(r.name);
    if (t.sizes().vec() != r.global_shape)
      throw Error("summon_full_params: parameter '" + r.name + "' is now of shape " + shape_text(t.sizes().vec()) +
                  ", not its " + shape_text(r.global_shape) + "; nothing was written back (change the values in "
                  "place, e.g. full[name].copy_(...))");
  }
  at::NoGradGuard no_grad;
  for (TensorShard& r : rows_) {
    const int64_t rows = r.local.dim() ? r.local.size(0) : 0;
    if (rows > 0)
      r.local.copy_(full_.at(r.name).reshape(r.global_shape).narrow(0, r.row_offset, rows).reshape(r.local.sizes()));
  }
  pending_ = false;
}

at::Tensor& FullParameters::operator[](const std::string& name) {
  const auto it = full_.find(name);
  if (it != full_.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [n, t] : full_) names.push_back(n);
  throw Error("summon_full_params: no parameter '" + name + "'; the parameters are: " + join_names(names));
}

FullParameters ShardedModule::summon_full_params(bool writable) {
  // Over the control group (Gloo, CPU tensors) from host copies: the same path on every device.
  CheckpointState st = weights_state(*impl_->engine);
  std::vector<TensorShard> rows = st.tensors;  // views of the shards, for the write-back
  stage_on_host(st);
  const std::vector<at::Tensor> whole = gather_whole(*impl_->runtime.groups->control(), st.tensors);
  std::map<std::string, at::Tensor> full;
  for (size_t i = 0; i < whole.size(); ++i) full[st.tensors[i].name] = whole[i].contiguous();
  return FullParameters(std::move(full), std::move(rows), writable);
}

bool ShardedModule::save_in_flight() { return impl_->saver && impl_->saver->in_flight(); }
void ShardedModule::wait_for_save() {
  if (impl_->saver) impl_->saver->wait();
}

void ShardedModule::save(const std::string& dir, const Optimizer& optimizer, int64_t step, const std::string& backend,
                         const std::map<std::string, std::string>& backend_options) {
  Impl& m = *impl_;
  std::string key = backend;
  for (const auto& [k, v] : backend_options) key += "\n" + k + "=" + v;
  if (m.saver && key != m.saver_key) {  // another backend or options: the save in flight ends first
    m.saver->wait();
    m.saver.reset();
  }
  auto b = m.saver ? m.save_backend : m.runtime.host.create<CheckpointBackend>(backend, backend_options);
  CheckpointState st = checkpoint_state(*m.engine, optimizer, /*for_load=*/false);
  st.step = step;
  TrainerState state;  // what fsdpx-train's checkpoints hold; the library's loop has no data source of fsdpx's
  state.step = step;
  state.data = TrainerState::kNoDataPosition;
  st.trainer_state_json = state.to_json();
  auto* streamed = dynamic_cast<StreamedCheckpointBackend*>(b.get());
  if (!m.saver && streamed && streamed->saves_in_background()) {
    m.saver = make_checkpoint_saver(*streamed, *m.runtime.groups, *m.engine, m.runtime.device);
    m.save_backend = b;
    m.saver_key = key;
  }
  if (m.saver) return m.saver->save(dir, st);
  stage_on_host(st);
  b->save(dir, st, checkpoint_context(*m.runtime.groups, *m.engine));
}

int64_t ShardedModule::load(const std::string& dir, Optimizer& optimizer, const std::string& backend) {
  auto b = impl_->runtime.host.create<CheckpointBackend>(backend);
  CheckpointState st = checkpoint_state(*impl_->engine, optimizer, /*for_load=*/true);
  const HostStaging staging = stage_on_host(st);
  const CheckpointContext ctx = checkpoint_context(*impl_->runtime.groups, *impl_->engine);
  load_checkpoint(dir, st, [&](CheckpointState& s) { b->load(dir, s, ctx); }, {});
  staging.copy_back();
  load_optimizer_state(st, optimizer);
  return st.step;
}

void ShardedModule::save(const std::string& dir, torch::optim::Optimizer& optimizer, int64_t step,
                         const std::string& backend, const std::map<std::string, std::string>& backend_options) {
  const TorchOptimizerState view(optimizer, *impl_->model->module(), *impl_->engine);
  save(dir, view, step, backend, backend_options);
}

int64_t ShardedModule::load(const std::string& dir, torch::optim::Optimizer& optimizer, const std::string& backend) {
  TorchOptimizerState view(optimizer, *impl_->model->module(), *impl_->engine);
  return load(dir, view, backend);
}

std::shared_ptr<Optimizer> ShardedModule::optimizer(const std::string& name,
                                                    const std::map<std::string, std::string>& options) {
  auto opt = impl_->runtime.host.create<Optimizer>(name, options);
  opt->init(impl_->engine->shards());
  return opt;
}

std::unique_ptr<ShardedModule> fully_shard(Runtime& runtime, std::shared_ptr<Model> model,
                                           const ShardOptions& options) {
  if (!model || !model->module()) throw Error("fully_shard: the model is null, or has no module");
  Runtime::Impl& rt = *runtime.impl_;
  auto impl = std::make_unique<ShardedModule::Impl>(ShardedModule::Impl{rt, model, {}, {}, {}, {}, {}});
  const auto strategy = rt.host.create<ShardingStrategy>(options.sharding, options.sharding_options);
  const auto wrap = rt.host.create<WrapPolicy>(options.wrap, options.wrap_options);
  const auto precision = std::shared_ptr<const PrecisionPolicy>(
      rt.host.create<PrecisionPolicy>(options.precision, options.precision_options));
  EngineOptions eo;
  eo.layout = strategy->layout(rt.topology.topology);
  eo.precision = precision->spec("");
  use_precision_policy(eo, precision);
  eo.overlap = options.overlap;
  eo.prefetch = options.prefetch;
  eo.reshard_after_forward_by_unit = options.reshard_after_forward;
  eo.activation_offload_units = options.activation_offload;
  eo.device = rt.device;
  eo.seed = options.seed;
  impl->engine = build_engine(impl->model, *wrap, LayerTypeChoices{}, *rt.groups, eo, impl->counters);
  return std::unique_ptr<ShardedModule>(new ShardedModule(std::move(impl)));
}

std::unique_ptr<ShardedModule> fully_shard(Runtime& runtime, std::shared_ptr<torch::nn::Module> module,
                                           const ShardOptions& options) {
  if (!module) throw Error("fully_shard: the module is null");
  auto adapter = std::make_shared<ModuleModel>(module);
  auto sharded = fully_shard(runtime, std::static_pointer_cast<Model>(adapter), options);
  check_values_agree(adapter->digests(), *runtime.impl_->groups->control());
  adapter->forget_values();
  return sharded;
}

}  // namespace fsdpx
