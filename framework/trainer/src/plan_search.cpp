// The search over compositions (plan_search.h): the configuration's open dimensions, their
// product walked with the micro-batch innermost and ascending (a composition's peak grows with its
// micro-batch, so the first that does not fit ends its row), each composition planned by plan_run
// exactly as --dry-run plans it.
#include "fsdpx/framework/trainer/plan_search.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "components.h"
#include "format.h"
#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "fsdpx/framework/trainer/train_command.h"
#include "fsdpx/framework/trainer/train_settings.h"

namespace fsdpx {
namespace {

// A composition fits a cluster's accelerator when its allocated peak is at most this share of the
// accelerator's memory: the rest is for what the plan does not count there (the CUDA context,
// NCCL's buffers, the caching allocator's fragmentation).
constexpr double kAcceleratorShare = 0.9;

using Flags = std::vector<std::string>;

// Where the configuration gives one of `keys` ("section." for any of a component's keys), or "".
std::string given_by(const RunConfig& c, const std::vector<std::string>& keys) {
  for (const auto& [key, origin] : c.given())
    for (const auto& k : keys)
      if (key == k || (k.back() == '.' && key.rfind(k, 0) == 0)) return origin;
  return "";
}

SearchDimension fixed_dimension(const std::string& name, const std::string& origin) {
  return SearchDimension{name, {{"", {}}}, origin};
}

SearchDimension sharding_dimension(const RunConfig& c, const TrainSettings& s, const Topology& t) {
  const std::string origin = given_by(c, {"sharding."});
  if (!origin.empty()) return fixed_dimension("sharding", origin);
  SearchDimension d{"sharding", {}, ""};
  for (const char* n : {"full_shard", "shard_grad_op", "no_shard"}) d.choices.push_back({n, {"--sharding.name", n}});
  for (int g = 2; g < t.world_size; ++g)  // every shard group that divides the ranks
    if (t.world_size % g == 0)
      d.choices.push_back({"hybrid_shard " + std::to_string(g),
                           {"--sharding.name", "hybrid_shard", "--sharding.shard_size", std::to_string(g)}});
  if (s.device != DeviceKind::Cpu) d.choices.push_back({"cpu_offload", {"--sharding.name", "cpu_offload"}});
  return d;
}

// The units and what they do with their activations: the model's first layer type as units (its
// repeated block), each storing its activations, recomputing them, or (on a device) recomputing
// from an input kept in host memory; or the whole model as one unit, FSDP's default, which
// cannot recompute (a unit recomputes inside its parent's forward, and the root has none).
SearchDimension units_dimension(const RunConfig& c, const TrainSettings& s, const std::string& layer) {
  const std::string wrap = given_by(c, {"wrap."});
  const std::string recompute = given_by(c, {"activation-checkpointing", "activation-offload"});
  if (!wrap.empty() && !recompute.empty()) return fixed_dimension("units", wrap + ", " + recompute);
  SearchDimension d{"units", {}, ""};
  std::vector<std::pair<std::string, Flags>> wraps;
  if (wrap.empty()) wraps = {{layer + " units", {"--wrap.name", "layer_type", "--wrap.layer_types", layer}}};
  else wraps = {{"units as given", {}}};
  for (const auto& [label, flags] : wraps) {
    d.choices.push_back({label, flags});
    if (!recompute.empty()) continue;  // as given
    Flags r = flags;
    r.insert(r.end(), {"--activation-checkpointing", layer});
    d.choices.push_back({label + ", recompute", r});
    if (s.device == DeviceKind::Cpu) continue;  // the activations are in host memory already
    r.insert(r.end(), {"--activation-offload", layer});
    d.choices.push_back({label + ", recompute, offload", r});
  }
  if (wrap.empty() && recompute.empty()) d.choices.push_back({"root only", {"--wrap.name", "root"}});
  return d;
}

SearchDimension step_in_backward_dimension(const RunConfig& c, const TrainSettings& s) {
  const std::string name = "--optimizer-in-backward";
  std::string origin = given_by(c, {"optimizer-in-backward"});
  if (origin.empty() && s.clip_grad_norm > 0) origin = "--clip-grad-norm, which needs every gradient first";
  if (origin.empty() && s.deterministic) origin = "--deterministic, which needs every gradient first";
  if (!origin.empty()) return fixed_dimension(name, origin);
  return SearchDimension{name, {{"", {}}, {"in backward", {name}}}, ""};
}

// float8 is left to a configuration that names it: it changes the numerics most, and only some
// accelerators have its rate.
SearchDimension precision_dimension(const RunConfig& c) {
  const std::string origin = given_by(c, {"precision."});
  if (!origin.empty()) return fixed_dimension("precision", origin);
  SearchDimension d{"precision", {}, ""};
  for (const char* n : {"fp32", "bf16_mixed", "pure_bf16"}) d.choices.push_back({n, {"--precision.name", n}});
  return d;
}

// The samples per rank per step stay; the search splits them into micro-batch x accumulation,
// smallest micro-batch first, unless the configuration gives --grad-accum.
SearchDimension micro_batch_dimension(const RunConfig& c, const TrainSettings& s) {
  const std::string origin = given_by(c, {"grad-accum"});
  if (!origin.empty()) return fixed_dimension("micro-batch", origin);
  SearchDimension d{"micro-batch", {}, ""};
  const int64_t samples = s.batch_size * s.grad_accum;
  for (int64_t m = 1; m <= samples; ++m)
    if (samples % m == 0)
      d.choices.push_back({std::to_string(m) + "x" + std::to_string(samples / m),
                           {"--batch-size", std::to_string(m), "--grad-accum", std::to_string(samples / m)}});
  return d;
}

// `args` less the action, --out (a run of the search's choice writes where its user says), and,
// where the search sets them, the micro-batch flags.
Flags base_args(const Flags& args, bool micro_batch_searched) {
  std::vector<std::string> drop = {"--out"};
  if (micro_batch_searched) drop.insert(drop.end(), {"--batch-size", "--grad-accum"});
  Flags out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    bool dropped = a == "--plan-search";
    for (const std::string& flag : drop) {
      if (a == flag) i += 1, dropped = true;  // and its value
      else if (a.rfind(flag + "=", 0) == 0) dropped = true;
    }
    if (!dropped) out.push_back(a);
  }
  return out;
}

// `args` resolved and planned as fsdpx-train's --dry-run resolves and plans them (each host flag
// it reads, read).
RunPlan plan_args(const PluginHost& host, const Flags& args, const ConfigRequest& request, const Topology& topology) {
  const RunConfig config = RunConfig::resolve(host, args, request);
  check_train_flags(config, 0);
  topology_flags(config.host_values());
  runtime_options(config.host_values(), topology);
  return plan_run(host, config, TrainSettings::from(config.host_values()), topology);
}

class Walk {
 public:
  Walk(const PluginHost& host, const ConfigRequest& request, const Topology& topology, PlanSearch& out)
      : host_(host), request_(request), topology_(topology), out_(out) {}

  // Every composition from dimension `i` on, after the choices `flags` and `label` made before it.
  void from(size_t i, const Flags& flags, const std::string& label) {
    const auto& dims = out_.dimensions;
    if (i + 1 == dims.size()) return micro_batches(dims[i], flags, label);
    for (const auto& [l, f] : dims[i].choices) {
      Flags next = flags;
      next.insert(next.end(), f.begin(), f.end());
      from(i + 1, next, l.empty() ? label : label.empty() ? l : label + ", " + l);
    }
  }

 private:
  void micro_batches(const SearchDimension& d, const Flags& flags, const std::string& label) {
    for (size_t j = 0; j < d.choices.size(); ++j) {
      const auto& [l, f] = d.choices[j];
      SearchedPlan p{flags, label.empty() ? l : l.empty() ? label : label + ", micro-batch " + l, {}};
      p.flags.insert(p.flags.end(), f.begin(), f.end());
      if (!plan(p)) continue;
      if (fits(p.plan)) {
        out_.fitting.push_back(std::move(p));
        continue;
      }
      if (out_.too_big++ == 0 || p.plan.memory.peak < out_.smallest_too_big.plan.memory.peak) out_.smallest_too_big = p;
      out_.pruned += static_cast<int64_t>(d.choices.size() - j - 1);
      return;
    }
  }

  bool plan(SearchedPlan& p) {
    Flags args = out_.base_args;
    args.insert(args.end(), p.flags.begin(), p.flags.end());
    ++out_.planned;
    try {
      p.plan = plan_args(host_, args, request_, topology_);
      return true;
    } catch (const std::exception& e) {
      ++out_.refused;
      const std::string why = message_of(e);
      if (std::find(out_.refusals.begin(), out_.refusals.end(), why) == out_.refusals.end())
        out_.refusals.push_back(why);
      return false;
    }
  }

  bool fits(const RunPlan& p) const {
    if (out_.memory_limit > 0) return p.memory.peak <= out_.memory_limit;
    return memory_fit_before_launch(p, p.topology.local_world_size, resident_bytes()).fits();
  }

  const PluginHost& host_;
  const ConfigRequest& request_;
  const Topology& topology_;
  PlanSearch& out_;
};

std::string fixed_text(double x, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, x);
  return text;
}

std::string quoted(const std::string& a) { return a.find_first_of(" \t'\"$") == std::string::npos ? a : "'" + a + "'"; }

std::string command_line(const std::string& program, const Flags& base, const Flags& flags) {
  std::string line = program;
  for (const auto& a : base) line += " " + quoted(a);
  for (const auto& a : flags) line += " " + quoted(a);
  return line;
}

// The search's first lines: what was searched and fixed, and what became of the compositions.
void write_summary(std::ostringstream& o, const PlanSearch& s, const RunPlan& first) {
  o << "plan search: " << first.model << " (" << human_count(static_cast<double>(first.total_params))
    << " parameters), " << first.topology.world_size << " rank(s), " << first.topology.local_world_size << " per node, "
    << first.samples_per_step << " samples per step; time on " << first.time_hardware << "\n";
  for (const auto& d : s.dimensions) {
    if (!d.fixed.empty()) {
      o << "  fixed      " << d.name << " (" << d.fixed << ")\n";
      continue;
    }
    o << "  searched   " << d.name << ":";
    for (size_t i = 0; i < d.choices.size(); ++i)
      o << (i ? " | " : " ") << (d.choices[i].first.empty() ? "off" : d.choices[i].first);
    o << "\n";
  }
  o << "  planned    " << s.planned << " of " << s.compositions << " compositions in " << fixed_text(s.seconds, 1)
    << " s: " << s.fitting.size() << " fit " << s.limit_source << ", " << s.too_big << " do not, " << s.refused
    << " refused by the plan; " << s.pruned << " not planned (a smaller micro-batch of theirs did not fit)\n";
  for (const auto& r : s.refusals) o << "  refused    " << r << "\n";
}

}  // namespace

std::string PlanSearch::text(size_t top) const {
  std::ostringstream o;
  if (fitting.empty()) {
    o << "plan search: none of " << compositions << " compositions fits " << limit_source << " (" << planned
      << " planned, " << too_big << " too big, " << refused << " refused)";
    if (too_big > 0)
      o << "; the smallest peak planned is " << human_bytes(static_cast<double>(smallest_too_big.plan.memory.peak))
        << " per rank (" << smallest_too_big.label << "): more ranks, or larger accelerators, would hold it";
    o << "\n";
    for (const auto& r : refusals) o << "  refused    " << r << "\n";
    return o.str();
  }
  write_summary(o, *this, fitting.front().plan);
  char line[512];
  std::snprintf(line, sizeof line, "  %4s %10s %10s %6s %11s  %-13s  %s\n", "rank", "step ms", "tokens/s", "MFU",
                "peak/rank", "bound", "composition");
  o << "\n" << line;
  const size_t n = std::min(top, fitting.size());
  for (size_t i = 0; i < n; ++i) {
    const RunPlan& p = fitting[i].plan;
    std::snprintf(line, sizeof line, "  %4zu %10.1f %10.0f %5.1f%% %11s  %-13s  %s\n", i + 1, 1e3 * p.time.step,
                  p.tokens_per_second(), 100 * p.mfu(), human_bytes(static_cast<double>(p.memory.peak)).c_str(),
                  p.time.bound.c_str(), fitting[i].label.c_str());
    o << line;
  }
  o << "\nthe fastest " << n << ", as command lines:\n";
  for (size_t i = 0; i < n; ++i)
    o << "  " << i + 1 << "  " << command_line(program, base_args, fitting[i].flags) << "\n";
  return o.str();
}

std::string PlanSearch::json() const {
  nlohmann::json j = {{"compositions", compositions},
                      {"planned", planned},
                      {"too_big", too_big},
                      {"refused", refused},
                      {"pruned", pruned},
                      {"seconds", seconds},
                      {"memory_limit_bytes", memory_limit},
                      {"refusals", refusals}};
  j["fitting"] = nlohmann::json::array();
  for (const auto& f : fitting) {
    Flags args = base_args;
    args.insert(args.end(), f.flags.begin(), f.flags.end());
    j["fitting"].push_back({{"label", f.label},
                            {"args", args},
                            {"step_s", f.plan.time.step},
                            {"tokens_per_s", f.plan.tokens_per_second()},
                            {"mfu", f.plan.mfu()},
                            {"peak_bytes", f.plan.memory.peak},
                            {"bound", f.plan.time.bound}});
  }
  return j.dump(1) + "\n";
}

PlanSearch search_plans(const PluginHost& host, const std::vector<std::string>& args, const ConfigRequest& request,
                        const Topology& topology) {
  const auto start = std::chrono::steady_clock::now();
  const RunConfig config = RunConfig::resolve(host, args, request);
  const TrainSettings s = TrainSettings::from(config.host_values());
  const std::vector<std::string> layers = make<Model>(host, config)->layer_types();
  if (layers.empty()) throw Error("--plan-search: the model names no layer type to make units of");
  PlanSearch out;
  out.dimensions = {sharding_dimension(config, s, topology), units_dimension(config, s, layers.front()),
                    step_in_backward_dimension(config, s), precision_dimension(config),
                    micro_batch_dimension(config, s)};
  out.base_args = base_args(args, out.dimensions.back().fixed.empty());
  out.compositions = 1;
  Flags first_flags;  // the first composition, planned first: a bad option is refused as --dry-run refuses it
  for (const auto& d : out.dimensions) {
    out.compositions *= static_cast<int64_t>(d.choices.size());
    first_flags.insert(first_flags.end(), d.choices.front().second.begin(), d.choices.front().second.end());
  }
  Flags first_args = out.base_args;
  first_args.insert(first_args.end(), first_flags.begin(), first_flags.end());
  const RunPlan first = plan_args(host, first_args, request, topology);
  if (!first.time.predicted())
    throw Error(
        "--plan-search ranks compositions by their predicted time, and this configuration's is not "
        "predicted: " +
        first.time_not_predicted + "; give --cluster FILE (configs/clusters/)");
  if (first.hardware_memory > 0) {
    out.memory_limit = static_cast<int64_t>(kAcceleratorShare * static_cast<double>(first.hardware_memory));
    out.limit_source = "in " + fixed_text(100 * kAcceleratorShare, 0) + "% of the cluster's " +
                       human_bytes(static_cast<double>(first.hardware_memory)) + " per accelerator";
  } else {
    out.limit_source = "this node (as the memory check before a launch counts it)";
  }
  Walk(host, request, topology, out).from(0, {}, "");
  // The fastest first; at the same time the smaller peak, then the shorter command line.
  std::stable_sort(out.fitting.begin(), out.fitting.end(), [](const SearchedPlan& a, const SearchedPlan& b) {
    return std::make_tuple(a.plan.time.step, a.plan.memory.peak, a.flags.size()) <
           std::make_tuple(b.plan.time.step, b.plan.memory.peak, b.flags.size());
  });
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace fsdpx
