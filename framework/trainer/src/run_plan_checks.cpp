#include "run_plan_checks.h"

#include <string>
#include <vector>

#include "components.h"
#include "fsdpx/capabilities.h"
#include "fsdpx/evaluation.h"
#include "fsdpx/framework/runtime/cpu_resources.h"
#include "fsdpx/framework/runtime/process_groups.h"  // device_spec
#include "fsdpx/loss_scaling.h"

namespace fsdpx {
namespace {

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

}  // namespace

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

void check_offload_optimizer(const RunPlan& plan) {
  if (plan.layout.offload_to_cpu && !plan.optimizer_runs_on_cpu)
    throw Error("sharding '" + plan.strategy +
                "' offloads the optimizer state to host memory and steps on the CPU, but optimizer '" + plan.optimizer +
                "' cannot run on the CPU; choose one that can (adamw, anyprecision_adamw, sgd) or a strategy "
                "without offload");
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
                plan.precision +
                "' scales the loss, whose step must first check every gradient for inf/NaN; drop "
                "one of them (bf16_mixed needs no loss scaling)");
  const ComponentRecord& rec = host.find(Kind::Optimizer, plan.optimizer);
  if (rec.plugin && rec.plugin->abi_minor < 2)
    throw Error("--optimizer-in-backward: " + rec.title() + " was built against plugin ABI 1." +
                std::to_string(rec.plugin->abi_minor) +
                ", before Optimizer::step_shards (1.2); rebuild it against "
                "this SDK, or drop --optimizer-in-backward");
  if (!opt.can_step_shards())
    throw Error("--optimizer-in-backward: optimizer '" + plan.optimizer +
                "' updates all its shards at once only "
                "(it does not implement Optimizer::step_shards); choose adamw, sgd or anyprecision_adamw, or drop "
                "--optimizer-in-backward");
}

void check_against_cluster(RunPlan& plan) {
  if (plan.hardware_per_node > 0 && plan.topology.local_world_size > plan.hardware_per_node)
    plan.warnings.push_back("the topology puts " + std::to_string(plan.topology.local_world_size) +
                            " ranks on a node, and the --cluster file's nodes have " +
                            std::to_string(plan.hardware_per_node) + " accelerators: the time assumes one rank each");
  if (plan.hardware_memory > 0 && plan.memory.peak > plan.hardware_memory)
    plan.warnings.push_back("the step's peak per rank, " + std::to_string(plan.memory.peak >> 20) +
                            " MiB, is more than the --cluster file's " + std::to_string(plan.hardware_memory >> 20) +
                            " MiB per accelerator: this composition does not fit there");
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

}  // namespace fsdpx
