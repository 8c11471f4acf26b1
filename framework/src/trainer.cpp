#include "fsdpx/framework/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/evaluation.h"
#include "fsdpx/framework/checkpointing.h"
#include "fsdpx/framework/lr_schedule.h"
#include "fsdpx/framework/sharding_engine.h"
#include "fsdpx/framework/unit_plan.h"
#include "fsdpx/interfaces.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace fsdpx {

std::map<Kind, std::string> default_components() {
  return {{Kind::Model, "gpt"},         {Kind::Data, "text"},       {Kind::Sharding, "full_shard"},
          {Kind::Wrap, "layer_type"},   {Kind::Precision, "fp32"},  {Kind::Optimizer, "adamw"}};
}

namespace {

// VmRSS / VmHWM of this process in bytes; -1 when /proc cannot tell.
struct ProcMemory {
  int64_t rss = -1, hwm = -1;  // VmRSS and VmHWM in bytes; -1 when /proc cannot tell
};

ProcMemory proc_memory() {
  std::ifstream in("/proc/self/status");
  std::string line;
  ProcMemory m;
  while (std::getline(in, line)) {
    if (line.compare(0, 6, "VmRSS:") == 0) m.rss = std::stoll(line.substr(6)) * 1024;
    if (line.compare(0, 6, "VmHWM:") == 0) m.hwm = std::stoll(line.substr(6)) * 1024;
  }
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Settings

po::options_description TrainSettings::options() {
  po::options_description d("Training (fsdpx-train's own options; also top-level keys of --config)");
  d.add_options()
    ("steps", po::value<int64_t>()->default_value(100), "optimizer steps to train (a resumed run counts from its checkpoint)")
    ("batch-size", po::value<int64_t>()->default_value(8), "samples per rank per micro-batch")
    ("grad-accum", po::value<int64_t>()->default_value(1), "micro-batches per optimizer step")
    ("seed", po::value<int64_t>()->default_value(0), "seed of the parameters and the data order")
    ("out", po::value<std::string>()->default_value(""), "run directory: metrics.jsonl, config.ini, summary.json, checkpoints")
    ("log-every", po::value<int64_t>()->default_value(10), "steps between metric lines")
    ("lr-schedule", po::value<std::string>()->default_value("constant"), "constant or cosine (the optimizer's lr is the peak)")
    ("warmup-steps", po::value<int64_t>()->default_value(0), "linear warm-up steps")
    ("min-lr-ratio", po::value<double>()->default_value(0.1, "0.1"), "cosine floor as a fraction of the peak lr")
    ("clip-grad-norm", po::value<double>()->default_value(0.0), "clip the global gradient norm to this (0: off)")
    ("eval-every", po::value<int64_t>()->default_value(0), "held-out evaluation every N steps (0: at the end only)")
    ("peak-tflops", po::value<double>()->default_value(0.0), "per-rank peak for MFU (0: measure on CPU with a large matmul)")
    ("overlap", po::value<int>()->default_value(1), "1: gather the next unit while this one computes; 0: no overlap")
    ("activation-checkpointing", po::value<std::string>()->default_value(""), "layer types (comma-separated) whose units recompute their activations in backward, e.g. Block")
    ("max-memory-mib", po::value<int64_t>()->default_value(0), "stop with an error when a rank's peak RSS in a step exceeds this many MiB (0: no limit)")
    ("save-every", po::value<int64_t>()->default_value(0), "checkpoint every N steps (0: at the end only); needs [checkpoint]")
    ("keep-last", po::value<int64_t>()->default_value(0), "keep the newest K checkpoints (0: all)")
    ("resume", po::value<std::string>()->default_value(""), "auto (newest complete checkpoint under OUT/checkpoints) or a checkpoint directory");
  return d;
}

TrainSettings TrainSettings::from(const po::variables_map& vm) {
  TrainSettings s;
  s.steps = vm["steps"].as<int64_t>();
  s.batch_size = vm["batch-size"].as<int64_t>();
  s.grad_accum = vm["grad-accum"].as<int64_t>();
  const int64_t seed = vm["seed"].as<int64_t>();
  s.out_dir = vm["out"].as<std::string>();
  s.log_every = vm["log-every"].as<int64_t>();
  s.lr_schedule = vm["lr-schedule"].as<std::string>();
  s.warmup_steps = vm["warmup-steps"].as<int64_t>();
  s.min_lr_ratio = vm["min-lr-ratio"].as<double>();
  s.clip_grad_norm = vm["clip-grad-norm"].as<double>();
  s.eval_every = vm["eval-every"].as<int64_t>();
  s.peak_tflops = vm["peak-tflops"].as<double>();
  const int overlap = vm["overlap"].as<int>();
  s.save_every = vm["save-every"].as<int64_t>();
  s.keep_last = vm["keep-last"].as<int64_t>();
  s.resume = vm["resume"].as<std::string>();
  {
    std::string types = vm["activation-checkpointing"].as<std::string>(), item;
    std::istringstream in(types);
    while (std::getline(in, item, ','))
      if (!item.empty()) s.checkpoint_layer_types.push_back(item);
  }
  s.max_memory_mib = vm["max-memory-mib"].as<int64_t>();
  auto positive = [](const char* name, int64_t v) {
    if (v < 1) throw Error(std::string("--") + name + " must be at least 1, got " + std::to_string(v));
  };
  auto non_negative = [](const char* name, double v) {
    if (!(v >= 0)) throw Error(std::string("--") + name + " must be 0 or more, got " + std::to_string(v));
  };
  positive("steps", s.steps);
  positive("batch-size", s.batch_size);
  positive("grad-accum", s.grad_accum);
  positive("log-every", s.log_every);
  if (seed < 0) throw Error("--seed must be 0 or more, got " + std::to_string(seed));
  s.seed = static_cast<uint64_t>(seed);
  non_negative("warmup-steps", static_cast<double>(s.warmup_steps));
  non_negative("clip-grad-norm", s.clip_grad_norm);
  non_negative("eval-every", static_cast<double>(s.eval_every));
  non_negative("peak-tflops", s.peak_tflops);
  non_negative("save-every", static_cast<double>(s.save_every));
  non_negative("keep-last", static_cast<double>(s.keep_last));
  non_negative("max-memory-mib", static_cast<double>(s.max_memory_mib));
  if (s.max_memory_mib > (int64_t{1} << 30)) throw Error("--max-memory-mib must be at most 2^30 MiB, got " + std::to_string(s.max_memory_mib));
  if (s.max_memory_mib > 0 && proc_memory().hwm < 0)
    throw Error("--max-memory-mib needs /proc/self/status (VmHWM) to measure memory, which this system does not provide");
  if (overlap != 0 && overlap != 1) throw Error("--overlap must be 0 or 1, got " + std::to_string(overlap));
  s.overlap = overlap == 1;
  // The schedule's own checks (kind, warm-up within the run, floor in [0, 1]).
  LrSchedule::parse(s.lr_schedule, 1.0, s.warmup_steps, s.steps, s.min_lr_ratio);
  if (s.resume == "auto" && s.out_dir.empty())
    throw Error("--resume auto looks for checkpoints under --out DIR, and no --out was given; give --out or a checkpoint path");
  return s;
}

std::string TrainSettings::to_ini() const {
  std::ostringstream o;
  o << "steps=" << steps << "\nbatch-size=" << batch_size << "\ngrad-accum=" << grad_accum << "\nseed=" << seed
    << "\nlog-every=" << log_every << "\nlr-schedule=" << lr_schedule << "\nwarmup-steps=" << warmup_steps
    << "\nmin-lr-ratio=" << min_lr_ratio << "\nclip-grad-norm=" << clip_grad_norm << "\neval-every=" << eval_every
    << "\npeak-tflops=" << peak_tflops << "\noverlap=" << (overlap ? 1 : 0) << "\nsave-every=" << save_every
    << "\nkeep-last=" << keep_last << "\nmax-memory-mib=" << max_memory_mib << "\n";
  if (!checkpoint_layer_types.empty()) {
    o << "activation-checkpointing=";
    for (size_t i = 0; i < checkpoint_layer_types.size(); ++i) o << (i ? "," : "") << checkpoint_layer_types[i];
    o << "\n";
  }
  if (!out_dir.empty()) o << "out=" << out_dir << "\n";
  return o.str();
}

// ---------------------------------------------------------------------------------------------
// Planning

namespace {

int64_t elt(c10::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    case at::kDouble: return "fp64";
    default: return c10::toString(t);
  }
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

const ComponentChoice& chosen(const RunConfig& config, Kind kind) {
  const ComponentChoice* c = config.choice(kind);
  if (!c) throw Error(std::string("no ") + section_name(kind) + " component chosen; give --" + section_name(kind) + ".name NAME");
  return *c;
}

template <class T>
std::shared_ptr<T> make(const PluginHost& host, const RunConfig& config) {
  const ComponentChoice& c = chosen(config, T::kKind);
  try {
    return host.create<T>(c.name, c.options);
  } catch (const Error& e) {
    throw Error(std::string(section_name(T::kKind)) + " '" + c.name + "': " + e.what());
  }
}

// Persistent optimizer state per parameter element, in bytes: measured on the optimizer itself
// by one step over a small parameter of the storage dtype (state of dim 0, e.g. a step count, is
// not per element and is left out, here as in the run's measurement).
// Whether `opt` can step on the CPU (fsdpx/capabilities.h; yes unless it says otherwise).
bool runs_on_cpu(const Optimizer& opt) {
  const auto* d = dynamic_cast<const OptimizerDevices*>(&opt);
  return !d || d->runs_on_cpu();
}

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

// The wrap policy's units, with --activation-checkpointing applied: units whose layer type is
// named recompute their activations.
std::vector<UnitSelection> select_units(Model& model, const WrapPolicy& wrap, const TrainSettings& s) {
  auto root = model.module();
  std::vector<UnitSelection> sel = wrap.select(*root);
  if (s.checkpoint_layer_types.empty()) return sel;
  const auto types = model.layer_types();
  std::map<std::string, std::string> type_of;
  for (const auto& m : root->named_modules("", /*include_self=*/false)) type_of[m.key()] = layer_type_name(*m.value());
  std::string unit_types;
  for (const auto& u : sel)
    if (unit_types.find(type_of[u.fqn]) == std::string::npos) unit_types += (unit_types.empty() ? "" : ", ") + type_of[u.fqn];
  for (const auto& t : s.checkpoint_layer_types) {
    if (std::find(types.begin(), types.end(), t) == types.end()) {
      std::string known;
      for (const auto& k : types) known += (known.empty() ? "" : ", ") + k;
      throw Error("--activation-checkpointing " + t + ": the model has no layer type '" + t + "'; its layer types are: " + known);
    }
    bool any = false;
    for (auto& u : sel)
      if (type_of[u.fqn] == t) any = u.activation_checkpoint = true;
    if (!any)
      throw Error("--activation-checkpointing " + t + ": no unit is a " + t + " (the wrap policy's units are: " + unit_types +
                  "); only units recompute, so make " + t + " a unit too (e.g. --wrap.layer_types " + t + ")");
  }
  return sel;
}

RunPlan plan_run(const PluginHost& host, const RunConfig& config, const TrainSettings& s, const Topology& topo) {
  RunPlan plan;
  plan.topology = topo;
  plan.model = chosen(config, Kind::Model).name;
  plan.data = chosen(config, Kind::Data).name;
  plan.strategy = chosen(config, Kind::Sharding).name;
  plan.wrap = chosen(config, Kind::Wrap).name;
  plan.precision = chosen(config, Kind::Precision).name;
  plan.optimizer = chosen(config, Kind::Optimizer).name;
  auto model = make<Model>(host, config);
  auto wrap = make<WrapPolicy>(host, config);
  auto strategy = make<ShardingStrategy>(host, config);
  auto precision = make<PrecisionPolicy>(host, config);
  plan.layout = strategy->layout(topo);
  plan.dtypes = precision->spec("");
  const auto& L = plan.layout;
  if (L.shard_group_size < 1 || L.replicate_group_size < 1 ||
      static_cast<int64_t>(L.shard_group_size) * L.replicate_group_size != topo.world_size)
    throw Error("sharding '" + plan.strategy + "' gives " + std::to_string(L.shard_group_size) + " x " +
                std::to_string(L.replicate_group_size) + " ranks, but the world has " + std::to_string(topo.world_size));

  if (config.choice(Kind::Checkpoint) && s.out_dir.empty())
    throw Error("checkpoint '" + config.choice(Kind::Checkpoint)->name +
                "' writes under --out DIR (DIR/checkpoints); give --out, or drop the [checkpoint] component");
  if (!config.choice(Kind::Checkpoint) && (s.save_every > 0 || !s.resume.empty()))
    throw Error(std::string(s.resume.empty() ? "--save-every" : "--resume") +
                " needs a checkpoint component: add --checkpoint.name sharded (or [checkpoint] name=sharded)");
  auto opt_probe = make<Optimizer>(host, config);
  plan.optimizer_runs_on_cpu = runs_on_cpu(*opt_probe);
  if (plan.layout.offload_to_cpu && !plan.optimizer_runs_on_cpu) {
    throw Error("sharding '" + plan.strategy + "' offloads the optimizer state to host memory and steps on the CPU, but "
                  "optimizer '" + plan.optimizer + "' cannot run on the CPU; choose one that can (adamw, "
                  "anyprecision_adamw, sgd) or a strategy without offload");
  }
  // The data: opened as rank 0 would, so a missing file or a too-large batch is caught now.
  auto data = make<DataSource>(host, config);
  const int64_t global = s.batch_size * s.grad_accum * topo.world_size;
  if (global > data->num_samples())
    throw Error("the global batch (--batch-size " + std::to_string(s.batch_size) + " x --grad-accum " +
                std::to_string(s.grad_accum) + " x " + std::to_string(topo.world_size) + " ranks = " +
                std::to_string(global) + " samples) is larger than the data set (" + std::to_string(data->num_samples()) +
                " training samples of data '" + plan.data + "'); lower --batch-size");
  data->open(DataContext{0, topo.world_size, s.batch_size, s.seed});
  Batch probe = data->next();
  plan.samples_per_step = s.batch_size * s.grad_accum * topo.world_size;
  plan.tokens_per_step = probe.samples > 0 ? probe.tokens / probe.samples * plan.samples_per_step : 0;
  plan.flops_per_token = model->flops_per_token();

  auto root = model->module();
  UnitPlan up = plan_units(*root, select_units(*model, *wrap, s));
  plan.total_params = up.total_params;
  const int64_t S = L.shard_group_size, R = L.replicate_group_size;
  const bool separate = S > 1 || plan.dtypes.compute != plan.dtypes.storage;
  const double opt_per_elt = optimizer_bytes_per_element(*opt_probe, plan.dtypes);
  int64_t ag = 0, rs = 0, ar = 0, sent = 0;
  for (size_t i = 0; i < up.units.size(); ++i) {
    const UnitInfo& u = up.units[i];
    UnitBytes b;
    b.fqn = u.fqn;
    b.params = u.num_params;
    for (const auto& shape : u.shapes) {
      const int64_t d0 = shape.empty() ? 1 : shape[0];
      int64_t row = 1;
      for (size_t k = 1; k < shape.size(); ++k) row *= shape[k];
      b.shard_numel += (d0 == 0 ? 0 : (d0 + S - 1) / S) * row;
    }
    b.reshard_after_forward = S > 1 && i > 0 && L.reshard_after_forward;
    b.recompute = u.activation_checkpoint;
    b.unsharded_bytes = separate ? S * b.shard_numel * elt(plan.dtypes.compute) : 0;
    plan.param_bytes += b.shard_numel * elt(plan.dtypes.storage);
    plan.grad_bytes += b.shard_numel * elt(plan.dtypes.gradient);
    if (opt_per_elt >= 0) plan.optimizer_bytes += static_cast<int64_t>(std::llround(opt_per_elt * static_cast<double>(b.shard_numel)));
    else plan.optimizer_bytes = -1;
    if (b.unsharded_bytes > plan.peak_unit_bytes) {
      plan.peak_unit_bytes = b.unsharded_bytes;
      plan.peak_unit = b.fqn.empty() ? "(root)" : b.fqn;
    }
    // The engine's collectives, with CountingCommunicator's formulas.
    if (S > 1) {
      const int64_t gather = S * b.shard_numel * elt(plan.dtypes.compute);
      const int64_t gathers = s.grad_accum * (b.reshard_after_forward ? 2 : 1);
      ag += gathers * gather;
      sent += gathers * (gather / S * (S - 1));
      const int64_t reduce = S * b.shard_numel * elt(plan.dtypes.reduce);
      rs += reduce;
      sent += reduce / S * (S - 1);
    }
    if (R > 1) {
      const int64_t reduce = b.shard_numel * elt(plan.dtypes.gradient);
      ar += reduce;
      sent += 2 * reduce * (R - 1) / R;
    }
    plan.units.push_back(b);
  }
  if (s.clip_grad_norm > 0 && S > 1) {  // the squared norm's all-reduce in the shard group
    ar += 8;
    sent += 2 * 8 * (S - 1) / S;
  }
  plan.allgather_bytes = ag;
  plan.reduce_scatter_bytes = rs;
  plan.all_reduce_bytes = ar;
  plan.sent_bytes = sent;
  return plan;
}

std::string RunPlan::text() const {
  std::ostringstream o;
  char line[256];
  const auto& t = topology;
  o << "plan (dry run: nothing allocated, no process group)\n";
  std::snprintf(line, sizeof line, "  topology   %d rank(s): %d node(s) x %d; shard groups of %d, replicated %d time(s)\n",
                t.world_size, t.num_nodes, t.local_world_size, layout.shard_group_size, layout.replicate_group_size);
  o << line;
  o << "  components model=" << model << " data=" << data << " sharding=" << strategy << " wrap=" << wrap
    << " precision=" << precision << " optimizer=" << optimizer << "\n";
  o << "  dtypes     storage " << dtype_name(dtypes.storage) << ", compute (and all-gather) " << dtype_name(dtypes.compute)
    << ", reduce " << dtype_name(dtypes.reduce) << ", gradient " << dtype_name(dtypes.gradient) << "\n";
  o << "  units      " << units.size() << " (reshard after forward: " << (layout.reshard_after_forward ? "yes" : "no") << ")\n";
  size_t w = 6;
  for (const auto& u : units) w = std::max(w, u.fqn.size());
  std::snprintf(line, sizeof line, "    %-*s %12s %14s %14s  %s\n", static_cast<int>(w), "unit", "params", "shard/rank", "gathered",
                "recompute");
  o << line;
  for (const auto& u : units) {
    std::snprintf(line, sizeof line, "    %-*s %12s %14s %14s  %s\n", static_cast<int>(w), u.fqn.empty() ? "(root)" : u.fqn.c_str(),
                  human_count(static_cast<double>(u.params)).c_str(), human_count(static_cast<double>(u.shard_numel)).c_str(),
                  human_bytes(static_cast<double>(u.unsharded_bytes)).c_str(), u.recompute ? "yes" : "no");
    o << line;
  }
  o << "  parameters " << human_count(static_cast<double>(total_params)) << " (" << total_params << ")\n";
  o << "  per rank   parameters " << human_bytes(static_cast<double>(param_bytes)) << " (" << param_bytes << " B), gradients "
    << human_bytes(static_cast<double>(grad_bytes)) << " (" << grad_bytes << " B), optimizer state ";
  if (optimizer_bytes >= 0) o << human_bytes(static_cast<double>(optimizer_bytes)) << " (" << optimizer_bytes << " B)\n";
  else o << "unknown (the optimizer cannot run on this CPU to be measured)\n";
  o << "  peak unit  " << (peak_unit.empty() ? "none gathered (parameters used in place)" : peak_unit + ", " +
                           human_bytes(static_cast<double>(peak_unit_bytes)) + " gathered")
    << "\n";
  o << "  per step   all-gather " << human_bytes(static_cast<double>(allgather_bytes)) << ", reduce-scatter "
    << human_bytes(static_cast<double>(reduce_scatter_bytes)) << ", all-reduce " << human_bytes(static_cast<double>(all_reduce_bytes))
    << "; this rank sends " << human_bytes(static_cast<double>(sent_bytes)) << " (" << sent_bytes << " B)\n";
  o << "  batch      " << samples_per_step << " samples";
  if (tokens_per_step != samples_per_step) o << ", " << tokens_per_step << " tokens";
  o << " per step";
  if (flops_per_token > 0) {
    std::snprintf(line, sizeof line, "; %.3g GFLOP per step", flops_per_token * static_cast<double>(tokens_per_step) / 1e9);
    o << line;
  }
  o << "\n";
  return o.str();
}

namespace {

json plan_json(const RunPlan& p) {
  json units = json::array();
  for (const auto& u : p.units)
    units.push_back({{"unit", u.fqn}, {"params", u.params}, {"shard_numel", u.shard_numel},
                     {"gathered_bytes", u.unsharded_bytes}, {"reshard_after_forward", u.reshard_after_forward},
                     {"recompute", u.recompute}});
  return {{"world_size", p.topology.world_size},
          {"shard_group_size", p.layout.shard_group_size},
          {"replicate_group_size", p.layout.replicate_group_size},
          {"total_params", p.total_params},
          {"param_bytes", p.param_bytes},
          {"grad_bytes", p.grad_bytes},
          {"optimizer_bytes", p.optimizer_bytes},
          {"peak_unit", p.peak_unit},
          {"peak_unit_bytes", p.peak_unit_bytes},
          {"allgather_bytes", p.allgather_bytes},
          {"reduce_scatter_bytes", p.reduce_scatter_bytes},
          {"all_reduce_bytes", p.all_reduce_bytes},
          {"sent_bytes", p.sent_bytes},
          {"dtypes", {{"storage", dtype_name(p.dtypes.storage)}, {"compute", dtype_name(p.dtypes.compute)},
                      {"reduce", dtype_name(p.dtypes.reduce)}, {"gradient", dtype_name(p.dtypes.gradient)}}},
          {"units", units}};
}

}  // namespace

void write_plan_json(const RunPlan& plan, const std::string& path) {
  std::ofstream(path) << plan_json(plan).dump(2) << "\n";
}

// ---------------------------------------------------------------------------------------------
// Training

namespace {

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// Restarts VmHWM from the current RSS (Linux: "5" to /proc/self/clear_refs), so that the peak of
// one step can be read after it.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// The best of a few large matmuls in `dtype`, in TFLOP/s, on this rank (run by every rank at
// once, so shared cores are shared as they will be in training).
double measure_peak_tflops(c10::ScalarType dtype) {
  constexpr int64_t n = 1024;
  at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::matmul(a, b);  // warm-up
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    at::Tensor c = at::matmul(a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * n / best / 1e12;
}

std::string duration_text(double secs) {
  if (!(secs >= 0) || secs > 1e7) return "?";
  const int64_t s = static_cast<int64_t>(secs + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", static_cast<long>(s / 3600), static_cast<long>(s / 60 % 60), static_cast<long>(s % 60));
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", static_cast<long>(s / 60), static_cast<long>(s % 60));
  return buf;
}

// Rank 0's terminal output: a bar redrawn in place on a terminal, or one line per log interval.
class Reporter {
 public:
  Reporter(bool bar, int64_t steps) : steps_(steps) {
    if (bar) tty_ = std::fopen("/dev/tty", "w");
  }
  ~Reporter() {
    if (tty_) std::fclose(tty_);
  }
  void update(int64_t step, double loss, double per_s, const char* unit, double step_time, int64_t peak_mem, double eta,
              bool log_line, double lr) {
    char stats[256];
    std::snprintf(stats, sizeof stats, "loss %.4f | lr %.2e | %s %s/s | %.3f s/step | peak mem %s | ETA %s", loss, lr,
                  human_count(per_s).c_str(), unit, step_time, human_bytes(static_cast<double>(peak_mem)).c_str(),
                  duration_text(eta).c_str());
    if (tty_) {
      const int width = 24;
      const int filled = static_cast<int>(width * step / std::max<int64_t>(steps_, 1));
      std::fprintf(tty_, "\r\033[Kstep %ld/%ld [%s%s] %s", static_cast<long>(step), static_cast<long>(steps_),
                   std::string(static_cast<size_t>(filled), '#').c_str(), std::string(static_cast<size_t>(width - filled), '.').c_str(),
                   stats);
      std::fflush(tty_);
      drawn_ = true;
    }
    if (log_line && (!tty_ || step == steps_)) {
      if (drawn_) std::fprintf(tty_, "\n");
      drawn_ = false;
      std::printf("step %ld/%ld | %s\n", static_cast<long>(step), static_cast<long>(steps_), stats);
    }
  }
  void line(const std::string& text) {
    if (drawn_) std::fprintf(tty_, "\n");
    drawn_ = false;
    std::printf("%s\n", text.c_str());
  }

 private:
  int64_t steps_;
  std::FILE* tty_ = nullptr;
  bool drawn_ = false;
};

}  // namespace

void check_optimizer_runs_here(const RunPlan& plan) {
  if (!plan.optimizer_runs_on_cpu)
    throw Error("optimizer '" + plan.optimizer +
                "' cannot run on the CPU, where this build's engine computes; choose adamw, anyprecision_adamw or sgd");
}

int train(const PluginHost& host, const RunConfig& config, const TrainSettings& s, const RuntimeOptions& ro) {
  if (ro.device == DeviceKind::Cuda)
    throw Error("--device cuda: the sharding engine of this build computes on the CPU only (NCCL process groups are "
                "built and checked by --check-comm); use --device cpu");
  const auto wall_start = std::chrono::steady_clock::now();
  const Topology& topo = ro.topology;
  const int rank = topo.rank, world = topo.world_size;
  RunPlan plan = plan_run(host, config, s, topo);
  check_optimizer_runs_here(plan);

  auto groups = ProcessGroups::create(ro);
  auto model = make<Model>(host, config);
  auto data = make<DataSource>(host, config);
  auto wrap = make<WrapPolicy>(host, config);
  auto opt = make<Optimizer>(host, config);
  std::shared_ptr<CheckpointBackend> ckpt;
  if (config.choice(Kind::Checkpoint)) ckpt = make<CheckpointBackend>(host, config);
  if (!ckpt && (s.save_every > 0 || !s.resume.empty()))
    throw Error(std::string(s.resume.empty() ? "--save-every" : "--resume") +
                " needs a checkpoint component: add --checkpoint.name sharded (or [checkpoint] name=sharded)");

  EngineOptions eo;
  eo.layout = plan.layout;
  eo.precision = plan.dtypes;
  eo.seed = s.seed;
  eo.overlap = s.overlap;
  EngineComms comms;
  comms.world = groups->world();
  std::shared_ptr<CountingCommunicator> shard_counter, replicate_counter;
  const int S = eo.layout.shard_group_size, R = eo.layout.replicate_group_size;
  if (S > 1 && R > 1) {
    auto h = groups->hybrid(S);
    comms.shard = shard_counter = std::make_shared<CountingCommunicator>(h.shard);
    comms.replicate = replicate_counter = std::make_shared<CountingCommunicator>(h.replicate);
  } else if (S > 1) {
    comms.shard = shard_counter = std::make_shared<CountingCommunicator>(groups->world());
  } else if (R > 1) {
    comms.replicate = replicate_counter = std::make_shared<CountingCommunicator>(groups->world());
  }
  auto root = model->module();
  ShardingEngine engine(model, select_units(*model, *wrap, s), comms, eo);
  std::vector<ParamShard> shards = engine.shards();
  opt->init(shards);
  data->open(DataContext{rank, world, s.batch_size, s.seed});
  const LrSchedule schedule = LrSchedule::parse(s.lr_schedule, opt->base_lr(), s.warmup_steps, s.steps, s.min_lr_ratio);

  // The run directory (rank 0 writes; everyone reads the same path).
  const bool writer = rank == 0;
  std::ofstream metrics;
  if (writer && !s.out_dir.empty()) {
    std::error_code ec;
    fs::create_directories(s.out_dir, ec);
    if (ec) throw Error("--out " + s.out_dir + " cannot be created: " + ec.message());
    std::ofstream ini(fs::path(s.out_dir) / "config.ini");
    ini << "# fsdpx-train --config " << (fs::path(s.out_dir) / "config.ini").string() << " --nproc-per-node " << world
        << "  reproduces this run\n"
        << s.to_ini() << "\n"
        << config.to_ini();
    if (!ini) throw Error("cannot write " + (fs::path(s.out_dir) / "config.ini").string());
    write_plan_json(plan, (fs::path(s.out_dir) / "plan.json").string());
  }

  // Resume.
  int64_t start_step = 0;
  const std::string ckpt_root = s.out_dir.empty() ? "" : (fs::path(s.out_dir) / "checkpoints").string();
  if (!s.resume.empty()) {
    std::string dir = s.resume;
    if (s.resume == "auto") {
      auto latest = ckpt->latest(ckpt_root);
      dir = latest ? *latest : "";
    }
    if (!dir.empty()) {
      CheckpointState st = checkpoint_state(engine, *opt, /*for_load=*/true);
      CheckpointContext ctx = checkpoint_context(*groups, engine);
      ckpt->load(dir, st, ctx);
      apply_checkpoint(st, *opt, *data);
      start_step = st.step;
      if (writer) std::printf("resumed from %s at step %ld\n", dir.c_str(), static_cast<long>(start_step));
      if (start_step >= s.steps)
        throw Error("the checkpoint " + dir + " is at step " + std::to_string(start_step) + ", not before --steps " +
                    std::to_string(s.steps) + "; raise --steps to train further");
    } else if (writer) {
      std::printf("no complete checkpoint under %s yet: starting from step 0\n", ckpt_root.c_str());
    }
  }
  if (writer && !s.out_dir.empty()) {
    // A resumed run keeps the metrics up to its checkpoint and writes the rest anew.
    const fs::path mp = fs::path(s.out_dir) / "metrics.jsonl";
    std::vector<std::string> kept;
    if (start_step > 0) {
      std::ifstream old(mp);
      std::string line;
      while (std::getline(old, line)) {
        try {
          if (json::parse(line).value("step", int64_t{0}) <= start_step) kept.push_back(line);
        } catch (const json::exception&) {
        }
      }
    }
    metrics.open(mp, std::ios::trunc);
    for (const auto& l : kept) metrics << l << "\n";
  }

  // The peak for MFU.
  double peak = s.peak_tflops;
  const char* peak_source = "--peak-tflops";
  if (peak <= 0) {
    groups->world()->barrier().wait();
    at::Tensor p = at::full({1}, measure_peak_tflops(plan.dtypes.compute), at::kDouble);
    groups->world()->all_reduce(p, ReduceOp::Avg).wait();
    peak = p.item<double>();
    peak_source = "measured: best 1024^3 matmul on every rank at once";
  }
  Evaluable* evaluable = dynamic_cast<Evaluable*>(model.get());
  HeldOutData* heldout = dynamic_cast<HeldOutData*>(data.get());
  Reporter out(writer && s.progress_bar, s.steps);
  if (writer) {
    char l[256];
    std::snprintf(l, sizeof l, "training %s (%s parameters) on %s: %d rank(s), %s, %s, %s, %s; %ld samples per step",
                  plan.model.c_str(), human_count(static_cast<double>(plan.total_params)).c_str(), plan.data.c_str(), world,
                  plan.strategy.c_str(), plan.wrap.c_str(), plan.precision.c_str(), plan.optimizer.c_str(),
                  static_cast<long>(plan.samples_per_step));
    out.line(l);
    std::snprintf(l, sizeof l, "peak %.3f TFLOP/s per rank (%s)", peak, peak_source);
    out.line(l);
    if (plan.layout.offload_to_cpu)
      out.line("cpu offload: the compute device is the CPU, where the shards, gradients and optimizer state already live; "
               "nothing to move (the run is its base strategy's)");
  }

  auto counted = [&] {
    CommStats a = shard_counter ? shard_counter->stats() : CommStats{};
    CommStats b = replicate_counter ? replicate_counter->stats() : CommStats{};
    std::array<int64_t, 4> v{a[Collective::AllGather].payload_bytes + b[Collective::AllGather].payload_bytes,
                             a[Collective::ReduceScatter].payload_bytes + b[Collective::ReduceScatter].payload_bytes,
                             a[Collective::AllReduce].payload_bytes + b[Collective::AllReduce].payload_bytes,
                             a.sent_bytes() + b.sent_bytes()};
    return v;
  };

  auto evaluate = [&](int64_t step) -> json {
    if (!evaluable || !heldout || heldout->num_heldout() == 0) return json();
    at::NoGradGuard no_grad;
    const int64_t n = heldout->num_heldout();
    const int64_t per_rank = (n + world - 1) / world;
    const int64_t chunk = std::max<int64_t>(1, s.batch_size * 4);
    double sums[3] = {0, 0, 0};
    bool has_accuracy = true;
    for (int64_t off = 0; off < per_rank; off += chunk) {  // the same number of forwards on every rank
      const int64_t first = std::min(n, rank * per_rank + off);
      const int64_t last = std::min({n, rank * per_rank + per_rank, rank * per_rank + off + chunk});
      // Every rank runs every forward (the units' gathers are collective); a rank whose share is
      // used up runs one sample and does not count it.
      const bool empty = last <= first;
      Batch b = heldout->heldout(empty ? 0 : first, empty ? 1 : last - first);
      EvalSums r;
      engine.forward([&] {
        r = evaluable->evaluate(b);
        return at::zeros({}, at::kFloat);
      });
      if (empty) r = EvalSums{0, r.correct >= 0 ? 0.0 : -1.0, 0};
      sums[0] += r.loss_sum;
      sums[1] += std::max(0.0, r.correct);
      sums[2] += static_cast<double>(r.samples);
      has_accuracy = has_accuracy && r.correct >= 0;
    }
    at::Tensor t = at::empty({4}, at::kDouble);
    t[0] = sums[0];
    t[1] = sums[1];
    t[2] = sums[2];
    t[3] = has_accuracy ? 0.0 : 1.0;
    groups->world()->all_reduce(t, ReduceOp::Sum).wait();
    json e{{"step", step}, {"eval_loss", t[0].item<double>() / t[2].item<double>()}, {"eval_samples", t[2].item<int64_t>()}};
    if (t[3].item<double>() == 0) e["eval_accuracy"] = t[1].item<double>() / t[2].item<double>();
    if (writer) {
      char l[160];
      std::snprintf(l, sizeof l, "eval at step %ld: held-out loss %.4f", static_cast<long>(step), e["eval_loss"].get<double>());
      std::string line = l;
      if (e.contains("eval_accuracy")) {
        std::snprintf(l, sizeof l, ", accuracy %.2f%%", 100 * e["eval_accuracy"].get<double>());
        line += l;
      }
      std::snprintf(l, sizeof l, " over %ld samples", static_cast<long>(e["eval_samples"].get<int64_t>()));
      out.line(line + l);
      if (metrics.is_open()) metrics << e.dump() << std::endl;
    }
    return e;
  };

  auto save = [&](int64_t step) -> std::string {
    const std::string dir = (fs::path(ckpt_root) / checkpoint_dir_name(step)).string();
    CheckpointState st = checkpoint_state(engine, *opt, /*for_load=*/false);
    st.step = step;
    st.trainer_state_json = json{{"data", json::parse(data->state())}, {"seed", s.seed}, {"step", step}}.dump();
    st.config_ini = s.to_ini() + "\n" + config.to_ini();
    const auto t0 = std::chrono::steady_clock::now();
    ckpt->save(dir, st, checkpoint_context(*groups, engine));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (writer) {
      char l[300];
      std::snprintf(l, sizeof l, "checkpoint at step %ld: %s (%.2f s)", static_cast<long>(step), dir.c_str(), secs);
      out.line(l);
      if (s.keep_last > 0) prune_checkpoints(ckpt_root, s.keep_last);
    }
    groups->world()->barrier().wait();
    return dir;
  };

  // The loop.
  double first_loss = std::nan(""), last_loss = std::nan("");
  json last_eval;
  std::string last_checkpoint;
  std::array<int64_t, 4> step_comm{0, 0, 0, 0};
  int64_t max_step_rise = 0;
  // The run's peak RSS: VmHWM is restarted at every step (clear_refs), so it is collected here.
  int64_t run_peak = std::max(peak_rss_bytes(), proc_memory().hwm);
  auto interval_start = std::chrono::steady_clock::now();
  const auto train_start = interval_start;
  int64_t interval_steps = 0, interval_tokens = 0, interval_samples = 0;
  std::array<int64_t, 4> interval_comm_start = counted();
  for (int64_t step = start_step; step < s.steps; ++step) {
    const double lr = schedule.at(step);
    const std::array<int64_t, 4> comm_before = counted();
    const ProcMemory before = proc_memory();
    run_peak = std::max(run_peak, before.hwm);  // evaluations and saves since the last step
    const bool step_measured = reset_peak_rss() && before.rss >= 0;
    double loss_sum = 0;
    int64_t tokens = 0, samples = 0;
    for (int64_t m = 0; m < s.grad_accum; ++m) {
      engine.set_requires_gradient_sync(m == s.grad_accum - 1);
      Batch b = data->next();
      at::Tensor loss = engine.forward([&] { return model->loss(b) / static_cast<double>(s.grad_accum); });
      engine.backward(loss);
      loss_sum += loss.item<double>();
      tokens += b.tokens;
      samples += b.samples;
    }
    double grad_norm = -1;
    if (s.clip_grad_norm > 0) grad_norm = engine.clip_grad_norm(s.clip_grad_norm);
    opt->step(lr);
    const std::array<int64_t, 4> comm_after = counted();
    for (int k = 0; k < 4; ++k) step_comm[k] = comm_after[k] - comm_before[k];
    // One collective per step: every rank's loss share, tokens, samples, and memory (the rise of
    // the peak RSS over the RSS before the step: activations and transient buffers; the step's
    // peak, for --max-memory-mib; the run's peak, for the metrics).
    const int64_t step_peak = proc_memory().hwm;
    run_peak = std::max(run_peak, step_peak);
    constexpr int64_t kFields = 6;
    at::Tensor mine_step = at::empty({kFields}, at::kDouble);
    double* f = mine_step.data_ptr<double>();
    f[0] = loss_sum;
    f[1] = static_cast<double>(tokens);
    f[2] = static_cast<double>(samples);
    f[3] = step_measured ? static_cast<double>(step_peak - before.rss) : -1.0;  // -1: unknown
    f[4] = static_cast<double>(step_peak);
    f[5] = static_cast<double>(run_peak);
    at::Tensor all_step = at::empty({world * kFields}, at::kDouble);
    groups->world()->all_gather(all_step, mine_step).wait();
    const double* a = all_step.data_ptr<double>();
    double sum_loss = 0, sum_tokens = 0, sum_samples = 0, rise = -1, peak_max = 0;
    std::vector<int64_t> rank_peaks;
    for (int r = 0; r < world; ++r) {  // in rank order: the same result on every rank
      sum_loss += a[r * kFields];
      sum_tokens += a[r * kFields + 1];
      sum_samples += a[r * kFields + 2];
      rise = std::max(rise, a[r * kFields + 3]);
      peak_max = std::max(peak_max, a[r * kFields + 4]);
      rank_peaks.push_back(static_cast<int64_t>(a[r * kFields + 5]));
    }
    const int64_t step_rise = static_cast<int64_t>(rise);
    const int64_t step_peak_max = static_cast<int64_t>(peak_max);
    max_step_rise = std::max(max_step_rise, step_rise);
    if (s.max_memory_mib > 0 && step_peak_max > s.max_memory_mib * (int64_t{1} << 20))
      throw Error("step " + std::to_string(step + 1) + " reached a peak RSS of " + std::to_string(step_peak_max >> 20) +
                  " MiB on a rank, over --max-memory-mib " + std::to_string(s.max_memory_mib) +
                  "; lower --batch-size, or recompute activations (--activation-checkpointing)");
    const double loss = sum_loss / world;
    if (!std::isfinite(loss))
      throw Error("the loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1) +
                  "; training diverged: lower the optimizer's lr (--optimizer.lr), add --warmup-steps or --clip-grad-norm");
    if (std::isnan(first_loss)) first_loss = loss;
    last_loss = loss;
    ++interval_steps;
    interval_tokens += static_cast<int64_t>(sum_tokens);
    interval_samples += static_cast<int64_t>(sum_samples);
    const int64_t done = step + 1;
    const bool log_now = done % s.log_every == 0 || done == s.steps;
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - interval_start).count();
    const double step_time = elapsed / static_cast<double>(interval_steps);
    const bool tokens_matter = plan.tokens_per_step != plan.samples_per_step;
    const double per_s = static_cast<double>(tokens_matter ? interval_tokens : interval_samples) / std::max(elapsed, 1e-9);
    const double run_elapsed = std::chrono::duration<double>(now - train_start).count();
    const double eta = run_elapsed / static_cast<double>(done - start_step) * static_cast<double>(s.steps - done);
    if (log_now) {
      if (writer) {
        const std::array<int64_t, 4> comm_now = counted();
        const double tflops = plan.flops_per_token * static_cast<double>(interval_tokens) / std::max(elapsed, 1e-9) / 1e12;
        json m{{"step", done},
               {"loss", loss},
               {"lr", lr},
               {"tokens_per_s", static_cast<double>(interval_tokens) / std::max(elapsed, 1e-9)},
               {"samples_per_s", static_cast<double>(interval_samples) / std::max(elapsed, 1e-9)},
               {"step_time_s", step_time},
               {"peak_memory_bytes", rank_peaks},
               {"memory_kind", "rss"},
               {"step_rss_rise_bytes", step_rise},
               {"allgather_bytes", (comm_now[0] - interval_comm_start[0]) / interval_steps},
               {"reduce_scatter_bytes", (comm_now[1] - interval_comm_start[1]) / interval_steps},
               {"all_reduce_bytes", (comm_now[2] - interval_comm_start[2]) / interval_steps},
               {"sent_bytes", (comm_now[3] - interval_comm_start[3]) / interval_steps}};
        if (plan.flops_per_token > 0) {
          m["tflops"] = tflops;
          m["mfu"] = tflops / (peak * world);
        }
        if (grad_norm >= 0) m["grad_norm"] = grad_norm;
        metrics << m.dump() << std::endl;
        out.update(done, loss, per_s, tokens_matter ? "tok" : "samples", step_time, *std::max_element(rank_peaks.begin(), rank_peaks.end()), eta, true, lr);
      }
      interval_start = std::chrono::steady_clock::now();
      interval_steps = interval_tokens = interval_samples = 0;
      interval_comm_start = counted();
    } else if (writer) {
      out.update(done, loss, per_s, tokens_matter ? "tok" : "samples", step_time, run_peak, eta, false, lr);
    }
    if (s.eval_every > 0 && done % s.eval_every == 0 && done != s.steps) last_eval = evaluate(done);
    if (ckpt && s.save_every > 0 && done % s.save_every == 0 && done != s.steps) last_checkpoint = save(done);
  }
  last_eval = evaluate(s.steps);
  if (ckpt) last_checkpoint = save(s.steps);

  // What was measured, next to what was planned.
  MemoryReport mem = engine.memory();
  int64_t optimizer_bytes = 0;
  for (const auto& p : shards)
    if (p.param.requires_grad())
      for (const auto& [key, t] : opt->state(p.name))
        if (t.dim() > 0) optimizer_bytes += t.numel() * t.element_size();
  at::Tensor mine = at::full({4}, 0, at::kLong);
  mine[0] = mem.param_bytes;
  mine[1] = mem.grad_bytes;
  mine[2] = optimizer_bytes;
  mine[3] = std::max(run_peak, proc_memory().hwm);
  at::Tensor all = at::empty({4 * world}, at::kLong);
  groups->world()->all_gather(all, mine).wait();
  if (writer) {
    json ranks = json::array();
    for (int r = 0; r < world; ++r)
      ranks.push_back({{"param_bytes", all[4 * r].item<int64_t>()},
                       {"grad_bytes", all[4 * r + 1].item<int64_t>()},
                       {"optimizer_bytes", all[4 * r + 2].item<int64_t>()},
                       {"peak_rss_bytes", all[4 * r + 3].item<int64_t>()}});
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    json summary{{"steps", s.steps},
                 {"start_step", start_step},
                 {"first_loss", first_loss},
                 {"final_loss", last_loss},
                 {"world_size", world},
                 {"ranks", ranks},
                 {"last_step_comm",
                  {{"allgather_bytes", step_comm[0]}, {"reduce_scatter_bytes", step_comm[1]}, {"all_reduce_bytes", step_comm[2]},
                   {"sent_bytes", step_comm[3]}}},
                 {"plan", plan_json(plan)},
                 {"peak_tflops_per_rank", peak},
                 {"max_step_rss_rise_bytes", max_step_rise},
                 {"step_time_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count() /
                                     static_cast<double>(std::max<int64_t>(1, s.steps - start_step))},
                 {"wall_s", wall}};
    if (!last_eval.is_null()) summary["eval"] = last_eval;
    if (!last_checkpoint.empty()) summary["checkpoint"] = last_checkpoint;
    if (!s.out_dir.empty()) std::ofstream(fs::path(s.out_dir) / "summary.json") << summary.dump(2) << "\n";
    char l[200];
    std::snprintf(l, sizeof l, "done: %ld steps in %.1f s, loss %.4f -> %.4f", static_cast<long>(s.steps - start_step), wall,
                  first_loss, last_loss);
    out.line(l);
    if (!s.out_dir.empty()) {
      out.line("metrics:    " + (fs::path(s.out_dir) / "metrics.jsonl").string());
      out.line("config:     " + (fs::path(s.out_dir) / "config.ini").string());
      out.line("plot:       scripts/fsdpx-plot " + s.out_dir + "  (writes " + (fs::path(s.out_dir) / "plot.png").string() + ")");
      if (!last_checkpoint.empty()) out.line("checkpoint: " + last_checkpoint);
    }
  }
  groups->world()->barrier().wait();
  return 0;
}

}  // namespace fsdpx
