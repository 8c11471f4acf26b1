#include "fsdpx/framework/trainer/run_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <nlohmann/json.hpp>

#include "components.h"
#include "unit_selection.h"
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/framework/engine/unit_buffers.h"
#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/framework/engine/unit_precision.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/framework/runtime/device.h"
#include "format.h"
#include "plan_json.h"
#include "fsdpx/activation_memory.h"
#include "fsdpx/capabilities.h"
#include "fsdpx/evaluation.h"
#include "fsdpx/loss_scaling.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/framework/trainer/checkpoint_saver.h"  // staging_pool_layout
#include "fsdpx/framework/runtime/process_groups.h"  // device_spec

using json = nlohmann::json;

namespace fsdpx {
namespace {

int64_t elt(c10::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

// Persistent optimizer state per parameter element, in bytes: measured on the optimizer itself
// by one step over a small parameter of the storage dtype (state of dim 0, e.g. a step count, is
// not per element and is left out, here as in the run's measurement). -1 when the optimizer
// cannot step here.
// `opt`: a fresh instance, which the probe consumes.
double optimizer_bytes_per_element(Optimizer& opt, const PrecisionSpec& p) {
  if (!runs_on_cpu(opt)) return -1;  // cannot probe here
  constexpr int64_t n = 4096;
  at::Tensor param = at::zeros({n}, at::TensorOptions().dtype(p.storage));
  param.set_requires_grad(true);
  param.mutable_grad() = at::full({n}, 1e-3, at::TensorOptions().dtype(p.gradient));
  opt.init({ParamShard{"probe", param}});
  opt.step(0.0);
  int64_t bytes = 0;
  for (const auto& [key, t] : opt.state("probe"))
    if (t.dim() > 0) bytes += t.numel() * t.element_size();
  return static_cast<double>(bytes) / n;
}

}  // namespace

namespace {

// Components, layout and dtypes; the checks that need no data or model. Returns the precision
// policy it made, for the units' own dtypes (one per plan).
std::shared_ptr<PrecisionPolicy> plan_components(const PluginHost& host, const RunConfig& config,
                                                 const TrainSettings& s, RunPlan& plan) {
  const Topology& topo = plan.topology;
  plan.model = chosen(config, Kind::Model).name;
  plan.data = chosen(config, Kind::Data).name;
  plan.strategy = chosen(config, Kind::Sharding).name;
  plan.wrap = chosen(config, Kind::Wrap).name;
  plan.precision = chosen(config, Kind::Precision).name;
  plan.optimizer = chosen(config, Kind::Optimizer).name;
  plan.layout = make<ShardingStrategy>(host, config)->layout(topo);
  auto precision = make<PrecisionPolicy>(host, config);
  plan.dtypes = precision->spec("");
  const auto& L = plan.layout;
  if (L.shard_group_size < 1 || L.replicate_group_size < 1 ||
      static_cast<int64_t>(L.shard_group_size) * L.replicate_group_size != topo.world_size)
    throw Error("sharding '" + plan.strategy + "' gives " + std::to_string(L.shard_group_size) + " x " +
                std::to_string(L.replicate_group_size) + " ranks, but the world has " +
                std::to_string(topo.world_size));
  if (config.choice(Kind::Checkpoint) && s.out_dir.empty())
    throw Error("checkpoint '" + config.choice(Kind::Checkpoint)->name +
                "' writes under --out DIR (DIR/checkpoints); give --out, or drop the [checkpoint] component");
  if (!config.choice(Kind::Checkpoint) && (s.save_every > 0 || !s.resume.empty()))
    throw Error(std::string(s.resume.empty() ? "--save-every" : "--resume") +
                " needs a checkpoint component: add --checkpoint.name sharded (or [checkpoint] name=sharded)");
  return precision;
}

// --eval-every N > 0 takes effect only where the model evaluates (fsdpx::Evaluable) and the data
// holds samples out (fsdpx::HeldOutData); otherwise it is refused instead of doing nothing.
void check_evaluation(const RunConfig& config, Model& model, DataSource& data, const TrainSettings& s) {
  if (s.eval_every == 0) return;
  const std::string flag = "--eval-every " + std::to_string(s.eval_every);
  const auto* heldout = dynamic_cast<HeldOutData*>(&data);
  if (!heldout || heldout->num_heldout() == 0)
    throw Error(flag + " would evaluate nothing: data '" + chosen(config, Kind::Data).name + "' has " +
                (heldout ? "an empty held-out share (raise its --data.holdout)" : "no held-out share") +
                "; drop --eval-every, or use data that holds samples out (text, csv, seq2seq)");
  if (!dynamic_cast<Evaluable*>(&model))
    throw Error(flag + " would evaluate nothing: model '" + chosen(config, Kind::Model).name +
                "' cannot evaluate (it offers no fsdpx::Evaluable); drop --eval-every");
}

// The data: opened as rank 0 would, so a missing file or a too-large batch is caught now; the
// samples and tokens of a step.
void plan_data(const PluginHost& host, const RunConfig& config, const TrainSettings& s, Model& model, RunPlan& plan) {
  const int world = plan.topology.world_size;
  auto data = make<DataSource>(host, config);
  const int64_t global = s.batch_size * s.grad_accum * world;
  if (global > data->num_samples())
    throw Error("the global batch (--batch-size " + std::to_string(s.batch_size) + " x --grad-accum " +
                std::to_string(s.grad_accum) + " x " + std::to_string(world) + " ranks = " + std::to_string(global) +
                " samples) is larger than the data set (" + std::to_string(data->num_samples()) +
                " training samples of data '" + plan.data + "'); lower --batch-size");
  check_evaluation(config, model, *data, s);
  data->open(DataContext{0, world, s.batch_size, s.seed});
  Batch probe = data->next();
  plan.samples_per_step = global;
  plan.tokens_per_step = probe.samples > 0 ? probe.tokens / probe.samples * plan.samples_per_step : 0;
}

// A precision policy whose options name units (fsdpx::UnitNameCheck) checks them against the
// run's units: a name matching none is refused, as it would change nothing.
void check_unit_names(const RunConfig& config, const PrecisionPolicy& precision, const UnitPlan& up) {
  const auto* check = dynamic_cast<const UnitNameCheck*>(&precision);
  if (!check) return;
  std::vector<std::string> units;
  for (const auto& u : up.units) units.push_back(u.fqn);
  try {
    check->check_unit_names(units);
  } catch (const Error& e) {
    throw Error("precision '" + chosen(config, Kind::Precision).name + "': " + e.what());
  }
}

// float8 all-gather's part of the plan: per unit, the shard elements it gathers in float8 (the
// float8 units' linear weights the model lists, as the engine's builder chooses them; none when
// off), checked as the engine checks it, and the amaxes' all-reduce before each forward.
std::vector<int64_t> plan_float8_gather(const Model& model, const PrecisionPolicy& precision, const UnitPlan& up,
                                        const TrainSettings& s, RunPlan& plan) {
  std::vector<int64_t> numel(up.units.size(), 0);
  const auto* float8 = dynamic_cast<const Float8Units*>(&precision);
  const auto* gather = dynamic_cast<const Float8AllGather*>(&precision);
  plan.float8_all_gather = float8 && gather && gather->float8_all_gather();
  if (!plan.float8_all_gather) return numel;
  const auto* linear = dynamic_cast<const LinearWeights*>(&model);
  const int64_t S = plan.layout.shard_group_size;
  int64_t weights = 0;  // each gets one float32 amax in the all-reduce
  for (size_t i = 0; i < up.units.size() && linear; ++i) {
    const UnitInfo& u = up.units[i];
    if (!float8->float8(u.fqn)) continue;
    for (size_t j = 0; j < u.names.size(); ++j) {
      if (!gathers_in_float8(linear->linear_weight(u.names[j]), u.shapes[j])) continue;
      numel[i] += ShardGeometry(u.shapes[j], S).shard_numel;
      ++weights;
    }
  }
  check_float8_all_gather(static_cast<int>(S), linear != nullptr, weights);
  const int64_t forwards = s.deterministic ? s.grad_accum * s.batch_size : s.grad_accum;
  const int64_t bytes = weights * static_cast<int64_t>(sizeof(float));
  plan.all_reduce_bytes += forwards * bytes;
  plan.sent_bytes += forwards * ring_sent_bytes(Collective::AllReduce, bytes, S);
  return numel;
}

// One unit's shard, gathered size and per-rank bytes, in the unit's own dtypes.
UnitBytes unit_bytes(const UnitInfo& u, bool root, const RunPlan& plan, const PrecisionSpec& dtypes,
                     int64_t float8_numel) {
  const int64_t S = plan.layout.shard_group_size;
  UnitBytes b;
  b.fqn = u.fqn;
  b.params = u.num_params;
  b.shard_numel = padded_shard_numel(u.shapes, S);
  b.float8_numel = float8_numel;
  b.recompute = u.activation_checkpoint;
  b.dtypes = dtypes;
  // Offloading on a device, every unit comes to the device in the compute dtype, one rank too (the
  // memory plan's rule, memory_plan.cpp).
  b.unsharded_bytes = plan.layout.offloads(plan.device == DeviceKind::Cpu) && float8_numel == 0
                          ? S * b.shard_numel * static_cast<int64_t>(c10::elementSize(dtypes.compute))
                          : gathered_bytes(b.shard_numel, S, dtypes, float8_numel);
  b.gather_bytes = all_gather_bytes(b.shard_numel, S, dtypes, float8_numel);
  b.reshard_after_forward = reshards_after_forward(plan.layout, root, std::nullopt, b.unsharded_bytes > 0);
  return b;
}

// Adds unit `b`'s collectives per step to the plan, sent as CountingCommunicator counts them
// (ring_sent_bytes). `forwards`: forward-backward passes per step (micro-batches; deterministic:
// local samples).
void add_unit_traffic(const UnitBytes& b, int64_t forwards, RunPlan& plan) {
  const int64_t S = plan.layout.shard_group_size, R = plan.layout.replicate_group_size;
  if (S > 1) {
    const int64_t gather = b.gather_bytes;
    const int64_t gathers = forwards * (b.reshard_after_forward ? 2 : 1);
    plan.allgather_bytes += gathers * gather;
    plan.sent_bytes += gathers * ring_sent_bytes(Collective::AllGather, gather, S);
  }
  if (plan.deterministic) {  // per sample: every world rank's rows of each shard, one all-to-all
    const int64_t W = plan.topology.world_size;  // (unsharded: all of it, one all-gather)
    const int64_t exchange = W * b.shard_numel * elt(b.dtypes.reduce);
    (S == 1 ? plan.allgather_bytes : plan.all_to_all_bytes) += forwards * exchange;
    plan.sent_bytes += forwards * ring_sent_bytes(S == 1 ? Collective::AllGather : Collective::AllToAll, exchange, W);
    return;
  }
  if (S > 1) {
    const int64_t reduce = S * b.shard_numel * elt(b.dtypes.reduce);
    plan.reduce_scatter_bytes += reduce;
    plan.sent_bytes += ring_sent_bytes(Collective::ReduceScatter, reduce, S);
  }
  if (R > 1) {
    const int64_t reduce = b.shard_numel * elt(b.dtypes.gradient);
    plan.all_reduce_bytes += reduce;
    plan.sent_bytes += ring_sent_bytes(Collective::AllReduce, reduce, R);
  }
}

// The policy's answer for one unit, checked as the engine checks it (unit_precision.h).
PrecisionSpec unit_precision(const PrecisionPolicy& policy, const std::string& fqn, const PrecisionSpec& root) {
  PrecisionSpec s = policy.spec(fqn);
  check_unit_precision(fqn, s, root);
  return s;
}

// The step's memory per rank: the engine's protocol replayed in bytes over the units, with the
// activations the model states for one forward (one sample in deterministic mode).
void plan_memory(const Model& model, const UnitPlan& up, const TrainSettings& s, RunPlan& plan) {
  StepMemoryInput in;
  std::vector<PrecisionSpec> dtypes;
  for (const auto& u : plan.units) dtypes.push_back(u.dtypes);
  in.units = units_for_memory(up, plan.layout.shard_group_size, dtypes);
  for (size_t i = 0; i < in.units.size(); ++i) in.units[i].float8_numel = plan.units[i].float8_numel;
  if (s.device != DeviceKind::Cpu)  // on the CPU the activations are in host memory already
    for (auto& u : in.units) u.offload_activations = plan.activation_offload_units.count(u.fqn) > 0;
  in.layout = plan.layout;
  in.world_size = plan.topology.world_size;
  in.optimizer_bytes = std::max<int64_t>(0, plan.optimizer_bytes);
  in.overlap = s.overlap;
  in.deterministic = s.deterministic;
  in.forwards = s.deterministic ? s.grad_accum * s.batch_size : s.grad_accum;
  in.clip_grad_norm = s.clip_grad_norm > 0;
  in.step_in_backward = s.optimizer_in_backward;
  in.offload = plan.layout.offloads(s.device == DeviceKind::Cpu);
  // Gloo's all-to-all receives into the device's memory only where the device is the CPU; sim and
  // CUDA stage through the host (StagedCommunicator) or reduce in place (NCCL).
  in.staged_reduce = s.device == DeviceKind::Cpu;
  if (const auto* a = dynamic_cast<const ActivationMemory*>(&model)) {
    const int64_t seq = plan.samples_per_step > 0 ? plan.tokens_per_step / plan.samples_per_step : 1;
    in.layers = a->activations(s.deterministic ? 1 : s.batch_size, seq, plan.dtypes.compute);
    plan.activations_stated = true;
  }
  plan.memory = predict_step_memory(in);
  if (s.device != DeviceKind::Cuda)
    plan.resident_peak =
        plan.memory.peak + (s.device == DeviceKind::Cpu ? plan.memory.peak * kCpuBlockCacheSlackPercent / 100 : 0);
  plan.process_bytes = std::max<int64_t>(0, resident_bytes());
  if (in.step_in_backward) {
    in.step_in_backward = false;
    plan.option_savings.emplace_back("--optimizer-in-backward", predict_step_memory(in).peak - plan.memory.peak);
    in.step_in_backward = true;
  }
  if (plan.memory.activation_host_bytes > 0) {
    for (auto& u : in.units) u.offload_activations = false;
    plan.option_savings.emplace_back("--activation-offload", predict_step_memory(in).peak - plan.memory.peak);
  }
}

// Threads per rank, and a warning when the compute dtype has no fast path on this CPU.
void plan_cpu(RunPlan& plan) {
  plan.threads = choose_threads(process_environment(), plan.topology.local_world_size, affinity_cpus());
  bool bf16 = false;
  for (const auto& u : plan.units) bf16 = bf16 || u.dtypes.compute == at::kBFloat16;
  if (bf16 && !has_fast_bf16(cpu_flags()))
    plan.warnings.push_back(
        "compute in bf16 on a CPU without native bf16 (no avx512_bf16 or amx_bf16 in /proc/cpuinfo): its matmuls run "
        "3 to 10x slower than in fp32 here (gpt small's step about 5x); --precision.name fp32 trains faster on this "
        "machine");
}

// The staging pool a save of this rank's shards and optimizer state goes through, as the saver
// lays it out (staging_pool_layout): its rows are at most 4 bytes an element (fp32 state).
void plan_checkpoint_pool(const CheckpointBackend& backend, const UnitPlan& up, RunPlan& plan) {
  const auto* streamed = dynamic_cast<const StreamedCheckpointBackend*>(&backend);
  if (!streamed || (!streamed->saves_in_background() && plan.device == DeviceKind::Cpu)) return;
  int64_t widest = 1;
  for (const auto& u : up.units)
    for (const auto& shape : u.shapes) widest = std::max(widest, 4 * row_numel(shape));
  const int64_t rank_bytes = plan.param_bytes + std::max<int64_t>(0, plan.optimizer_bytes);
  plan.checkpoint_pool_bytes = staging_pool_layout(streamed->staging_bytes(), rank_bytes, widest).pool_bytes;
}

// --optimizer-in-backward needs an optimizer that steps a range of shards (Optimizer::
// step_shards, plugin ABI 1.2; the host never calls it on an older plugin's object) and no inf
// check over every gradient before the step (fp16's loss scaling).
void check_optimizer_in_backward(const PluginHost& host, const TrainSettings& s, const Optimizer& opt,
                                 const PrecisionPolicy& precision, RunPlan& plan) {
  plan.optimizer_in_backward = s.optimizer_in_backward;
  if (!s.optimizer_in_backward) return;
  if (plan.dtypes.loss_scaling || dynamic_cast<const LossScalingPolicy*>(&precision))
    throw Error("--optimizer-in-backward steps each unit as soon as its gradients are reduced, and precision '" +
                plan.precision + "' scales the loss, whose step must first check every gradient for inf/NaN; drop "
                "one of them (bf16_mixed needs no loss scaling)");
  const ComponentRecord& rec = host.find(Kind::Optimizer, plan.optimizer);
  if (rec.plugin && rec.plugin->abi_minor < 2)
    throw Error("--optimizer-in-backward: " + rec.title() + " was built against plugin ABI 1." +
                std::to_string(rec.plugin->abi_minor) + ", before Optimizer::step_shards (1.2); rebuild it against "
                "this SDK, or drop --optimizer-in-backward");
  if (!opt.can_step_shards())
    throw Error("--optimizer-in-backward: optimizer '" + plan.optimizer + "' updates all its shards at once only "
                "(it does not implement Optimizer::step_shards); choose adamw, sgd or anyprecision_adamw, or drop "
                "--optimizer-in-backward");
}

// The documented no-ops of this run (RunPlan::not_applied).
void plan_not_applied(RunPlan& plan) {
  if (plan.layout.offload_to_cpu && !plan.layout.offloads(plan.device == DeviceKind::Cpu))
    plan.not_applied.push_back("sharding '" + plan.strategy +
                               "': the compute device is the CPU, where the shards, gradients and optimizer state "
                               "already live; nothing to move (the run is its base strategy's)");
  if (plan.device == DeviceKind::Sim) return;
  // Every FSDPX_SIM_* set (a misspelt one is refused by RunConfig::refuse_unread, last in the plan).
  for (const auto& [name, value] : process_environment())
    if (name.rfind("FSDPX_SIM_", 0) == 0)
      plan.not_applied.push_back(name + "=" + value + " is a setting of the sim device, and this run's device is " +
                                 device_spec(plan.device) + "; unset it, or run with --device sim");
}

}  // namespace

RunPlan plan_run(const PluginHost& host, const RunConfig& config, const TrainSettings& s, const Topology& topo,
                 PlannedComponents* made) {
  RunPlan plan;
  plan.device = s.device;
  plan.topology = topo;
  plan.deterministic = s.deterministic;
  // Created in this order, so that the first bad option named is the same as ever.
  auto model = make<Model>(host, config);
  auto wrap = make<WrapPolicy>(host, config);
  const auto precision = plan_components(host, config, s, plan);
  plan_not_applied(plan);
  auto opt_probe = make<Optimizer>(host, config);
  plan.optimizer_runs_on_cpu = runs_on_cpu(*opt_probe);
  if (plan.layout.offload_to_cpu && !plan.optimizer_runs_on_cpu)
    throw Error("sharding '" + plan.strategy +
                "' offloads the optimizer state to host memory and steps on the CPU, but "
                "optimizer '" +
                plan.optimizer +
                "' cannot run on the CPU; choose one that can (adamw, "
                "anyprecision_adamw, sgd) or a strategy without offload");
  check_optimizer_in_backward(host, s, *opt_probe, *precision, plan);
  plan_data(host, config, s, *model, plan);
  plan.flops_per_token = model->flops_per_token();
  const std::vector<UnitSelection> selected = select_units(*model, *wrap, s.layer_type_choices());
  UnitPlan up = plan_units(*model->module(), selected);
  plan.activation_offload_units = offloaded_units(*model, selected, s.layer_type_choices());
  if (!plan.activation_offload_units.empty() && plan.device == DeviceKind::Cpu)
    plan.not_applied.push_back("--activation-offload: the compute device is the CPU, where the activations are in "
                               "host memory already; nothing to move (the run recomputes as "
                               "--activation-checkpointing says)");
  plan.total_params = up.total_params;
  const double opt_per_elt = optimizer_bytes_per_element(*opt_probe, plan.dtypes);
  check_unit_names(config, *precision, up);
  const auto* float8 = dynamic_cast<const Float8Units*>(precision.get());
  const std::vector<int64_t> float8_gathered = plan_float8_gather(*model, *precision, up, s, plan);
  for (size_t i = 0; i < up.units.size(); ++i) {
    const UnitInfo& u = up.units[i];
    UnitBytes b = unit_bytes(u, i == 0, plan, unit_precision(*precision, u.fqn, plan.dtypes), float8_gathered[i]);
    b.float8 = float8 && float8->float8(u.fqn);
    plan.param_bytes += b.shard_numel * elt(plan.dtypes.storage);
    plan.grad_bytes += b.shard_numel * elt(plan.dtypes.gradient);
    if (opt_per_elt >= 0)
      plan.optimizer_bytes += static_cast<int64_t>(std::llround(opt_per_elt * static_cast<double>(b.shard_numel)));
    else plan.optimizer_bytes = -1;
    if (b.unsharded_bytes > plan.peak_unit_bytes) {
      plan.peak_unit_bytes = b.unsharded_bytes;
      plan.peak_unit = b.fqn.empty() ? "(root)" : b.fqn;
    }
    add_unit_traffic(b, s.deterministic ? s.grad_accum * s.batch_size : s.grad_accum, plan);
    plan.units.push_back(b);
  }
  plan_memory(*model, up, s, plan);
  plan_cpu(plan);  // after the units: their compute dtypes decide the warning
  if (plan.deterministic)
    plan.threads = ThreadChoice{1, "--deterministic: CPU kernels may split their sums by thread count"};
  const int64_t S = plan.layout.shard_group_size;
  if (s.clip_grad_norm > 0 && S > 1) {  // the squared norm's all-reduce(s) in the shard group
    const int64_t bytes = plan.deterministic ? 16 : 8;  // deterministic: the largest square, then the fixed-point sum
    plan.all_reduce_bytes += bytes;
    plan.sent_bytes += ring_sent_bytes(Collective::AllReduce, bytes, S);
  }
  std::shared_ptr<CheckpointBackend> checkpoint;
  if (config.choice(Kind::Checkpoint)) checkpoint = make<CheckpointBackend>(host, config);  // its options read
  if (checkpoint) plan_checkpoint_pool(*checkpoint, up, plan);
  config.refuse_unread();  // every component and the host have read what they use
  if (made) *made = PlannedComponents{model, wrap, opt_probe, precision, checkpoint};
  return plan;
}

namespace {

// The plan's table of units: name, parameters, shard per rank, gathered bytes, recompute, and
// each unit's compute/reduce dtypes when units have their own (`mixed`).
void write_units(std::ostringstream& o, const std::vector<UnitBytes>& units, bool mixed) {
  char line[256];
  size_t w = 6;
  for (const auto& u : units) w = std::max(w, u.fqn.size());
  // The last column, with the dtypes after it when units have their own.
  auto last = [&](const std::string& recompute, const std::string& own) {
    return mixed ? recompute + std::string(recompute.size() < 11 ? 11 - recompute.size() : 1, ' ') + own : recompute;
  };
  std::snprintf(line, sizeof line, "    %-*s %12s %14s %14s  %s\n", static_cast<int>(w), "unit", "params", "shard/rank",
                "gathered", last("recompute", "compute/reduce").c_str());
  o << line;
  for (const auto& u : units) {
    const std::string own =
        dtype_name(u.dtypes.compute) + "/" + dtype_name(u.dtypes.reduce) + (u.float8 ? " float8" : "");
    std::snprintf(line, sizeof line, "    %-*s %12s %14s %14s  %s\n", static_cast<int>(w),
                  u.fqn.empty() ? "(root)" : u.fqn.c_str(), human_count(static_cast<double>(u.params)).c_str(),
                  human_count(static_cast<double>(u.shard_numel)).c_str(),
                  human_bytes(static_cast<double>(u.unsharded_bytes)).c_str(),
                  last(u.recompute ? "yes" : "no", own).c_str());
    o << line;
  }
}

// The plan's memory lines: the step's peak, what the system counts of it, what each option saves,
// what lives in host memory.
void write_memory(std::ostringstream& o, const RunPlan& p) {
  const std::string on_device = p.device == DeviceKind::Cpu ? "" : " on " + std::string(device_spec(p.device));
  o << "  peak       " << human_bytes(static_cast<double>(p.memory.peak)) << " (" << p.memory.peak
    << " B) per rank, allocated" << on_device << ", at " << p.memory.peak_where
    << "; forward " << human_bytes(static_cast<double>(p.memory.forward_peak)) << ", backward "
    << human_bytes(static_cast<double>(p.memory.backward_peak)) << ", optimizer "
    << human_bytes(static_cast<double>(p.memory.optimizer_peak)) << "; activations "
    << (p.activations_stated ? human_bytes(static_cast<double>(p.memory.activation_bytes)) + " per forward"
                           : std::string("not counted (the model does not state them)"))
    << "\n";
  if (p.resident_peak > 0)
    o << "  resident   " << human_bytes(static_cast<double>(p.resident_peak + p.process_bytes)) << " ("
      << p.resident_peak + p.process_bytes << " B) per rank at the step's peak, as the system counts it: the peak "
      << (p.device == DeviceKind::Cpu ? "allocated and " + std::to_string(kCpuBlockCacheSlackPercent) +
                                          "% more that the block cache keeps, "
                                    : std::string("in sim's memory, "))
      << human_bytes(static_cast<double>(p.process_bytes)) << " of the process besides\n";
  for (const auto& [option, saved] : p.option_savings)
    o << "  saves      " << option << ": " << human_bytes(static_cast<double>(saved)) << " (" << saved
      << " B) of the peak per rank\n";
  if (p.memory.host_bytes > 0)
    o << "  host       " << human_bytes(static_cast<double>(p.memory.host_bytes)) << " (" << p.memory.host_bytes
      << " B) per rank in pinned host memory: shards, gradient shards and optimizer state (cpu_offload)\n";
  if (p.memory.activation_host_bytes > 0)
    o << "  host       " << human_bytes(static_cast<double>(p.memory.activation_host_bytes)) << " ("
      << p.memory.activation_host_bytes << " B) per rank in pinned host memory after a forward: the recomputed units' "
      << "inputs (--activation-offload)\n";
}

}  // namespace

std::string RunPlan::text() const {
  std::ostringstream o;
  char line[256];
  const auto& t = topology;
  o << "plan (dry run: nothing allocated, no process group)\n";
  std::snprintf(line, sizeof line,
                "  topology   %d rank(s): %d node(s) x %d; shard groups of %d, replicated %d time(s)\n", t.world_size,
                t.num_nodes, t.local_world_size, layout.shard_group_size, layout.replicate_group_size);
  o << line;
  o << "  threads    " << threads.threads << " per rank (" << threads.why << ")\n";
  o << "  components model=" << model << " data=" << data << " sharding=" << strategy << " wrap=" << wrap
    << " precision=" << precision << " optimizer=" << optimizer << "\n";
  bool mixed = false;  // units with dtypes of their own: a column for them
  size_t float8 = 0;  // units whose linears compute in float8: a column when not all of them do
  for (const auto& u : units) {
    mixed = mixed || u.dtypes.compute != dtypes.compute || u.dtypes.reduce != dtypes.reduce;
    float8 += u.float8 ? 1 : 0;
  }
  mixed = mixed || (float8 > 0 && float8 < units.size());
  if (mixed)
    o << "  dtypes     storage " << dtype_name(dtypes.storage) << ", gradient " << dtype_name(dtypes.gradient)
      << "; compute (and all-gather) and reduce per unit (below)\n";
  else
    o << "  dtypes     storage " << dtype_name(dtypes.storage) << ", compute (and all-gather) "
      << dtype_name(dtypes.compute) << ", reduce " << dtype_name(dtypes.reduce) << ", gradient "
      << dtype_name(dtypes.gradient) << "\n";
  if (float8 > 0)
    o << "  float8     the linear layers of "
      << (float8 == units.size() ? "every unit" : std::to_string(float8) + " of the units below")
      << ": e4m3 inputs and weights, e5m2 output gradients, one scale per tensor (the output projection "
         "stays in the compute dtype)\n";
  if (float8_all_gather) {
    int64_t f8 = 0, all = 0;
    for (const auto& u : units) {
      f8 += u.float8_numel;
      all += u.shard_numel;
    }
    o << "  float8     all-gather: " << f8 << " of the " << all
      << " shard elements (the float8 units' linear weights) gathered in e4m3, cast with one scale per weight "
         "computed before each forward (one all-reduce of their amaxes)\n";
  }
  o << "  units      " << units.size() << " (reshard after forward: " << (layout.reshard_after_forward ? "yes" : "no")
    << ")\n";
  write_units(o, units, mixed);
  o << "  parameters " << human_count(static_cast<double>(total_params)) << " (" << total_params << ")\n";
  o << "  per rank   parameters " << human_bytes(static_cast<double>(param_bytes)) << " (" << param_bytes
    << " B), gradients " << human_bytes(static_cast<double>(grad_bytes)) << " (" << grad_bytes
    << " B), optimizer state ";
  if (optimizer_bytes >= 0)
    o << human_bytes(static_cast<double>(optimizer_bytes)) << " (" << optimizer_bytes << " B)\n";
  else o << "unknown (the optimizer cannot run on this CPU to be measured)\n";
  o << "  peak unit  " << (peak_unit.empty() ? "none gathered (parameters used in place)" : peak_unit + ", " +
                           human_bytes(static_cast<double>(peak_unit_bytes)) + " gathered")
    << "\n";
  write_memory(o, *this);
  o << "  per step   all-gather " << human_bytes(static_cast<double>(allgather_bytes)) << ", reduce-scatter "
    << human_bytes(static_cast<double>(reduce_scatter_bytes)) << ", all-reduce "
    << human_bytes(static_cast<double>(all_reduce_bytes)) << "; this rank sends "
    << human_bytes(static_cast<double>(sent_bytes)) << " (" << sent_bytes << " B)\n";
  if (deterministic)
    o << "  deterministic one sample per forward, one thread per rank; per sample, every rank's rows of each "
         "shard sent by one all-to-all over the world and added in global-sample order: "
      << human_bytes(static_cast<double>(all_to_all_bytes)) << " (" << all_to_all_bytes << " B) per step\n";
  o << "  batch      " << samples_per_step << " samples";
  if (tokens_per_step != samples_per_step) o << ", " << tokens_per_step << " tokens";
  o << " per step";
  if (flops_per_token > 0) {
    std::snprintf(line, sizeof line, "; %.3g GFLOP per step",
                  flops_per_token * static_cast<double>(tokens_per_step) / 1e9);
    o << line;
  }
  o << "\n";
  for (const auto& warning : warnings) o << "  warning    " << warning << "\n";
  if (checkpoint_pool_bytes > 0)
    o << "  checkpoint saves stage through " << human_bytes(static_cast<double>(checkpoint_pool_bytes)) << " ("
      << checkpoint_pool_bytes << " B) of host memory per rank (the checkpoint's pool_mib bounds it)\n";
  for (const auto& what : not_applied) o << "  not applied " << what << "\n";
  return o.str();
}

void write_plan_json(const RunPlan& plan, const std::string& path) {
  std::ofstream(path) << plan_json(plan).dump(2) << "\n";
}

namespace {

std::string bytes_text(int64_t bytes) { return human_bytes(static_cast<double>(bytes)); }
// With the exact count where the rounded one hides it.
std::string exact_bytes(int64_t bytes) {
  return bytes_text(bytes) + (bytes >= 1024 ? " (" + std::to_string(bytes) + " B)" : std::string());
}

std::string joined(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

// Device memory that is host memory: the CPU's, and sim's (its blocks are the host's pages).
bool peak_in_host_memory(const RunPlan& plan) { return plan.device != DeviceKind::Cuda; }

// The host's side: `ranks` x (the step's peak where it lives in host memory, the offloaded bytes,
// and `process_bytes`) against available_memory().
MemorySide host_side(const RunPlan& plan, int ranks, int64_t process_bytes) {
  MemorySide h;
  h.ranks = ranks;
  std::vector<std::string> parts;
  if (peak_in_host_memory(plan)) {
    h.per_rank += plan.resident_peak;
    const std::string device = device_spec(plan.device);
    parts.push_back("the step's peak " + bytes_text(plan.resident_peak) + " resident (" +
                    bytes_text(plan.memory.peak) + " allocated" +
                    (plan.device == DeviceKind::Cpu ? " and the block cache's slack)"
                                                    : ") in " + device + "'s memory, which is the host's"));
  }
  if (plan.memory.host_bytes > 0) {
    h.per_rank += plan.memory.host_bytes;
    parts.push_back(bytes_text(plan.memory.host_bytes) + " offloaded (cpu_offload)");
  }
  if (plan.memory.activation_host_bytes > 0) {
    h.per_rank += plan.memory.activation_host_bytes;
    parts.push_back(bytes_text(plan.memory.activation_host_bytes) + " of offloaded activations");
  }
  if (plan.checkpoint_pool_bytes > 0) {
    h.per_rank += plan.checkpoint_pool_bytes;
    parts.push_back(bytes_text(plan.checkpoint_pool_bytes) + " checkpoint staging pool");
  }
  if (process_bytes > 0) {
    h.per_rank += process_bytes;
    parts.push_back(bytes_text(process_bytes) + " per process besides");
  }
  h.what = parts.empty() ? "nothing" : joined(parts, " + ");
  const AvailableMemory a = available_memory();
  h.available = a.bytes;
  h.source = a.bytes < 0 ? "neither MemAvailable nor a memory cgroup's limit could be read" : a.source;
  return h;
}

// The device's side: `ranks` x the step's peak; what it can give is for the caller to read.
MemorySide device_side(const RunPlan& plan, int ranks) {
  MemorySide d;
  d.ranks = ranks;
  d.per_rank = plan.memory.peak;
  d.what = "the step's peak, at " + plan.memory.peak_where;
  return d;
}

// sim's side: without a budget (FSDPX_SIM_MEMORY unset, empty or 0) its memory is the host's
// (counted there); with one (sim parses it: bytes or KiB/MiB/GiB), what `sim` has
// left of it (sim device 0 opened here when `sim` is null).
void read_sim_budget(const DeviceRuntime* sim, MemorySide& d) {
  const char* env = std::getenv("FSDPX_SIM_MEMORY");
  const std::string raw = env ? env : "";
  if (raw.empty() || raw.find_first_not_of('0') == std::string::npos) {
    d.ranks = 0;
    d.source = "no budget (FSDPX_SIM_MEMORY unset): sim's memory is the host's, counted there";
    return;
  }
  try {
    std::shared_ptr<DeviceRuntime> opened;
    if (!sim) sim = (opened = open_device("sim", 0)).get();
    d.available = sim->free_memory();  // the budget less what this process's sim holds
    d.source = "sim's budget per device, FSDPX_SIM_MEMORY=" + raw;
  } catch (const std::exception& e) {
    d.source = "sim's budget unread: " + message_of(e);
  }
}

// The local ranks that share this rank's device: open_device's round-robin over the devices this
// process sees (more ranks than devices: --share-gpus, or --backend gloo).
int ranks_sharing(const DeviceRuntime& device, const Topology& t) {
  const int count = static_cast<int>(c10::impl::getDeviceGuardImpl(device.device().type())->deviceCount());
  if (count <= 0) return 1;
  int sharing = 0;
  for (int r = 0; r < t.local_world_size; ++r) sharing += r % count == device.device().index();
  return std::max(sharing, 1);
}

// One side as a phrase: its bytes, what is available, and its verdict.
std::string side_text(const std::string& name, const MemorySide& s) {
  if (s.ranks == 0) return name + ": " + s.source;
  std::string t = name + ": " + std::to_string(s.ranks) + (s.ranks == 1 ? " rank x " : " ranks x ") +
                  bytes_text(s.per_rank) + " (" + s.what + ") = " + exact_bytes(s.planned()) + " planned";
  if (s.available < 0) return t + ", not checked: " + s.source;
  return t + (s.fits() ? ", and " : ", but ") + exact_bytes(s.available) + " is available (" + s.source +
         "): " + (s.fits() ? "fits" : "does not fit");
}

// What would make the plan fit, for the sides that do not.
std::string ways_out(const RunPlan& plan, const MemoryFit& f) {
  const bool device_short = !f.device.fits(), host_short = !f.host.fits();
  std::vector<std::string> ways;
  if (device_short && f.device.ranks > 1) ways.push_back("put fewer ranks on each device (they share it)");
  else if (device_short) ways.push_back("spread the shards over more ranks (each holds 1/N)");
  if (host_short) ways.push_back("spread the ranks over more nodes (fewer per node)");
  if (device_short && !plan.layout.offload_to_cpu)
    ways.push_back("hold shards, gradients and optimizer state in host memory (--sharding.name cpu_offload)");
  if (host_short && !device_short && plan.layout.offload_to_cpu)
    ways.push_back("keep them on the device (a strategy without cpu_offload)");
  if (device_short || (host_short && peak_in_host_memory(plan))) {
    ways.push_back("recompute activations (--activation-checkpointing Block)");
    ways.push_back("lower --batch-size");
  }
  ways.push_back("or start anyway with --skip-memory-check");
  return joined(ways, ", ");
}

}  // namespace

std::string MemoryFit::text() const {
  return "  memory     " + side_text("device " + device_name, device) + "\n             " + side_text("host", host) +
         "\n";
}

std::string MemoryFit::refusal(const RunPlan& plan) const {
  return "the plan does not fit this node: " + side_text("device " + device_name, device) + "; " +
         side_text("host", host) + "; " + ways_out(plan, *this);
}

MemoryFit memory_fit_before_launch(const RunPlan& plan, int local_ranks, int64_t process_bytes) {
  MemoryFit f;
  f.device_name = device_spec(plan.device);
  f.host = host_side(plan, local_ranks, std::max<int64_t>(0, process_bytes));
  if (plan.device == DeviceKind::Sim) {
    // The busiest device: the ranks go round-robin over the devices.
    const int count = std::max(1, visible_device_count("sim"));
    f.device = device_side(plan, (local_ranks + count - 1) / count);
    read_sim_budget(nullptr, f.device);
  } else if (plan.device == DeviceKind::Cuda) {
    f.device = device_side(plan, 1);
    f.device.source = "each rank reads its GPU's free memory once it has opened it";
  } else {
    f.device.source = "the host's memory, counted there";
  }
  return f;
}

MemoryFit memory_fit_in_rank(const RunPlan& plan, const DeviceRuntime& device, const Topology& topology,
                             bool check_host) {
  MemoryFit f;
  f.device_name = device.name();
  if (check_host) f.host = host_side(plan, topology.local_world_size, 0);
  else f.host.source = "checked by the launcher before the ranks started";
  if (device.is_cpu()) {
    f.device.source = "the host's memory, counted there";
  } else if (device.device().is_cuda()) {
    f.device = device_side(plan, ranks_sharing(device, topology));
    f.device.available = device.free_memory();
    f.device.source = device.name() + "'s free memory, read once every rank had opened its device";
  } else {
    f.device = device_side(plan, ranks_sharing(device, topology));
    read_sim_budget(&device, f.device);
  }
  return f;
}

void check_memory_fits(const RunPlan& plan, const MemoryFit& fit) {
  if (!fit.fits()) throw Error(fit.refusal(plan));
}

void check_optimizer_runs_here(const RunPlan& plan) {
  if (!plan.optimizer_runs_on_cpu && (plan.device == DeviceKind::Cpu || plan.layout.offload_to_cpu))
    throw Error("optimizer '" + plan.optimizer +
                "' cannot run on the CPU, where this build's engine computes; choose adamw, anyprecision_adamw or sgd");
}

}  // namespace fsdpx
