// RunPlan's renderings: the --dry-run text and plan.json.
#include "fsdpx/framework/trainer/run_plan.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "format.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "plan_json.h"

namespace fsdpx {

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
    << " B) per rank, allocated" << on_device << ", at " << p.memory.peak_where << "; forward "
    << human_bytes(static_cast<double>(p.memory.forward_peak)) << ", backward "
    << human_bytes(static_cast<double>(p.memory.backward_peak)) << ", optimizer "
    << human_bytes(static_cast<double>(p.memory.optimizer_peak)) << "; activations "
    << (p.activations_stated ? human_bytes(static_cast<double>(p.memory.activation_bytes)) + " per forward"
                             : std::string("not counted (the model does not state them)"))
    << "\n";
  if (p.resident_peak > 0)
    o << "  resident   " << human_bytes(static_cast<double>(p.resident_peak + p.process_bytes)) << " ("
      << p.resident_peak + p.process_bytes << " B) per rank at the step's peak, as the system counts it: the peak "
      << (p.device == DeviceKind::Cpu
              ? "allocated and " + std::to_string(kCpuBlockCacheSlackPercent) + "% more that the block cache keeps, "
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

// The predicted step: its phases, what it reaches, and what bounds it; or why it is not predicted.
void write_time(std::ostringstream& o, const RunPlan& p) {
  if (!p.time.predicted()) {
    if (!p.time_not_predicted.empty()) o << "  time       not predicted: " << p.time_not_predicted << "\n";
    return;
  }
  const StepTime& t = p.time;
  char line[512];
  std::snprintf(line, sizeof line,
                "  time       %.1f ms per step (predicted): forward %.1f, backward %.1f (recompute %.1f), all-gather "
                "wait %.1f, reduce-scatter wait %.1f, optimizer %.1f ms\n",
                1e3 * t.step, 1e3 * t.forward, 1e3 * t.backward, 1e3 * t.recompute, 1e3 * t.all_gather_wait,
                1e3 * t.reduce_scatter_wait, 1e3 * t.optimizer);
  o << line;
  std::snprintf(line, sizeof line,
                "  speed      %.4g tokens/s, MFU %.1f%%; bound: %s (matmuls %.1f ms, memory-bound ops and copies %.1f "
                "ms, communication %.1f ms of which %.1f exposed)\n",
                p.tokens_per_second(), 100 * p.mfu(), t.bound.c_str(), 1e3 * t.matmul, 1e3 * (t.memory + t.copies),
                1e3 * t.communication, 1e3 * (t.all_gather_wait + t.reduce_scatter_wait));
  o << line;
  o << "  hardware   " << p.time_hardware << "\n";
}

// The batch per step, and its work.
void write_batch(std::ostringstream& o, const RunPlan& p) {
  char line[128];
  o << "  batch      " << p.samples_per_step << " samples";
  if (p.tokens_per_step != p.samples_per_step) o << ", " << p.tokens_per_step << " tokens";
  o << " per step";
  if (p.flops_per_token > 0) {
    std::snprintf(line, sizeof line, "; %.3g GFLOP per step",
                  p.flops_per_token * static_cast<double>(p.tokens_per_step) / 1e9);
    o << line;
  }
  o << "\n";
}

}  // namespace

double RunPlan::mfu() const {
  if (!time.predicted() || peak_flops <= 0 || topology.world_size <= 0) return 0;
  return flops_per_token * static_cast<double>(tokens_per_step) / topology.world_size / time.step / peak_flops;
}

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
  o << "  peak unit  "
    << (peak_unit.empty() ? "none gathered (parameters used in place)"
                          : peak_unit + ", " + human_bytes(static_cast<double>(peak_unit_bytes)) + " gathered")
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
  write_batch(o, *this);
  write_time(o, *this);
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

}  // namespace fsdpx
