#include "fsdpx/framework/trainer/run_plan.h"

#include <algorithm>
#include <cmath>

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include "components.h"
#include "fsdpx/activation_memory.h"
#include "fsdpx/capabilities.h"
#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/framework/engine/unit_buffers.h"
#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/framework/engine/unit_precision.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "fsdpx/framework/trainer/checkpoint_saver.h"  // staging_pool_layout
#include "run_plan_checks.h"
#include "step_costs.h"
#include "unit_selection.h"

namespace fsdpx {
namespace {

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
  b.unsharded_bytes =
      gathered_bytes(b.shard_numel, S, dtypes, float8_numel, plan.layout.offloads(plan.device == DeviceKind::Cpu));
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
    const int64_t exchange = W * b.shard_numel * element_bytes(b.dtypes.reduce);
    (S == 1 ? plan.allgather_bytes : plan.all_to_all_bytes) += forwards * exchange;
    plan.sent_bytes += forwards * ring_sent_bytes(S == 1 ? Collective::AllGather : Collective::AllToAll, exchange, W);
    return;
  }
  if (S > 1) {
    const int64_t reduce = S * b.shard_numel * element_bytes(b.dtypes.reduce);
    plan.reduce_scatter_bytes += reduce;
    plan.sent_bytes += ring_sent_bytes(Collective::ReduceScatter, reduce, S);
  }
  if (R > 1) {
    const int64_t reduce = b.shard_numel * element_bytes(b.dtypes.gradient);
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
// With `costs`, the replay predicts the step's time too (plan.time).
void plan_memory(const Model& model, const UnitPlan& up, const TrainSettings& s, RunPlan& plan,
                 const StepCosts* costs) {
  StepMemoryInput in;
  in.costs = costs;
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
  plan.time = plan.memory.time;
  in.costs = nullptr;  // the savings below are in bytes
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

// The costs of the step's parts on the hardware it is predicted on (step_costs.h); false, with
// plan.time_not_predicted saying why, where there is none. A bad --cluster file is refused; a
// probe that cannot run here only leaves the time out.
// `opt`: the instance the bytes were probed on (each component is made once per process; the run
// initialises it again over its own shards).
bool plan_costs(Optimizer& opt, const Model& model, const TrainSettings& s, double optimizer_bytes_per_element,
                RunPlan& plan, StepCosts& costs) {
  std::unique_ptr<Hardware> hw;
  try {
    hw = planning_hardware(s, plan, plan.time_not_predicted);
  } catch (const std::exception& e) {  // a probe's failure (a socket, Gloo) leaves the time out
    if (!s.cluster.empty()) throw;
    plan.time_not_predicted = std::string("a probe of this machine failed: ") + e.what();
  }
  if (!hw) return false;
  if (plan.optimizer_runs_on_cpu)
    hw->optimizer_seconds_per_element =
        optimizer_seconds_per_element(opt, plan.dtypes.storage, plan.dtypes.gradient, plan.threads.threads);
  costs = step_costs(plan, model, *hw, s.deterministic ? 1 : s.batch_size, optimizer_bytes_per_element);
  plan.time_hardware = hw->what;
  plan.peak_flops = hw->peak_flops(plan.dtypes.compute);
  plan.hardware_per_node = hw->accelerators_per_node;
  plan.hardware_memory = hw->memory_per_accelerator;
  return true;
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
  check_offload_optimizer(plan);
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
    plan.param_bytes += b.shard_numel * element_bytes(plan.dtypes.storage);
    plan.grad_bytes += b.shard_numel * element_bytes(plan.dtypes.gradient);
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
  plan_cpu(plan);  // after the units: their compute dtypes decide the warning
  if (plan.deterministic)
    plan.threads = ThreadChoice{1, "--deterministic: CPU kernels may split their sums by thread count"};
  StepCosts costs;
  const bool timed = plan_costs(*opt_probe, *model, s, opt_per_elt, plan, costs);
  plan_memory(*model, up, s, plan, timed ? &costs : nullptr);
  check_against_cluster(plan);
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

}  // namespace fsdpx
