// MemoryFit: the step's planned peak against what the host and the device have, before the
// workers start and again in each rank.
#include "fsdpx/framework/trainer/run_plan.h"

#include <algorithm>
#include <cstdlib>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "format.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/memory_accounting.h"

namespace fsdpx {

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
    parts.push_back("the step's peak " + bytes_text(plan.resident_peak) + " resident (" + bytes_text(plan.memory.peak) +
                    " allocated" +
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
