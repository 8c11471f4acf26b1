// RunPlan: what a run will hold and move, before anything is allocated (--dry-run, plan.json).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fsdpx/export.h"
#include "fsdpx/framework/engine/memory_plan.h"
#include "fsdpx/framework/engine/step_time.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/runtime/cpu_resources.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/interfaces.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/sharding_strategy.h"
#include "fsdpx/topology.h"

namespace fsdpx {

class DeviceRuntime;

// What a run will hold and move per step on each rank, computed from the model's shapes and the
// strategy, precision and optimizer without allocating the model or forming a process group.
struct UnitBytes {
  std::string fqn;
  int64_t params = 0;         // parameter elements gathered with this unit
  int64_t shard_numel = 0;    // elements of this rank's flat shard (padded)
  int64_t unsharded_bytes = 0;  // the gathered unit in the compute dtype (0 when it is the shard)
  int64_t float8_numel = 0;  // of shard_numel, the elements gathered in float8 (float8 all-gather)
  int64_t gather_bytes = 0;  // one all-gather's output (0 when unsharded)
  bool reshard_after_forward = false;
  bool recompute = false;       // activation checkpointing
  PrecisionSpec dtypes;         // the precision policy's answer for this unit
  bool float8 = false;          // its linear layers compute in float8 (fsdpx::Float8Units)
};

struct FSDPX_API RunPlan {
  Topology topology;
  ShardingLayout layout;
  std::string strategy, wrap, precision, optimizer, model, data;
  PrecisionSpec dtypes;  // the root unit's (each unit's own is in `units`)
  std::vector<UnitBytes> units;
  int64_t total_params = 0;
  int64_t param_bytes = 0;      // per rank: sharded parameters in the storage dtype
  int64_t grad_bytes = 0;       // per rank: sharded gradients in the gradient dtype
  int64_t optimizer_bytes = 0;  // per rank: optimizer state (measured per element on the optimizer)
  int64_t peak_unit_bytes = 0;  // the largest gathered unit
  std::string peak_unit;
  // Per step (grad_accum micro-batches), per rank: payload of each collective, and what this
  // rank sends under the ring algorithm.
  int64_t allgather_bytes = 0, reduce_scatter_bytes = 0, all_reduce_bytes = 0, sent_bytes = 0;
  int64_t all_to_all_bytes = 0;  // --deterministic's gradient exchange
  int64_t samples_per_step = 0, tokens_per_step = 0;
  double flops_per_token = 0;
  bool optimizer_runs_on_cpu = true;  // fsdpx/capabilities.h
  DeviceKind device = DeviceKind::Cpu;  // where the engine computes: memory.peak is that device's
  ThreadChoice threads;               // intra-op threads per rank, and why
  bool deterministic = false;         // --deterministic: its gradient exchange is all_to_all_bytes
  bool float8_all_gather = false;  // the float8 units gather their linear weights in float8
  bool optimizer_in_backward = false; // --optimizer-in-backward
  std::vector<std::string> warnings;  // what will make the run slow (printed by the plan and the run)
  // Settings the run reads that cannot apply to it, where the docs call them no-ops (cpu_offload
  // on the CPU, sim's FSDPX_SIM_* on another device): said once at start, in the plan's text, and
  // in config.ini as "# not applied: ..." (everything else that cannot apply is refused).
  std::vector<std::string> not_applied;
  std::set<std::string> activation_offload_units;  // --activation-offload's units (by path)
  // Host memory per rank that checkpoint saves stage through (checkpoint_saver.h): the pool of a
  // streamed backend saving in the background, or saving from a device; 0 when saves use none.
  int64_t checkpoint_pool_bytes = 0;
  // The step's predicted bytes per rank, allocated (fsdpx/framework/engine/memory_plan.h), and
  // whether the model stated its activations (fsdpx/activation_memory.h); without, none counted.
  StepMemory memory;
  bool activations_stated = false;
  // Host memory per rank at the step's peak as the system counts it (resident), where the step's
  // bytes live in host memory (the CPU, sim; 0 on CUDA): the allocated peak, plus on the CPU what
  // the block cache keeps beyond it (kCpuBlockCacheSlackPercent). And what the planning process
  // held resident before any tensor (LibTorch's code, the plugins): each rank holds as much besides.
  int64_t resident_peak = 0, process_bytes = 0;
  // What each memory option of the run saves of the step's peak per rank: the option as the
  // command line spells it, and the planned peak without it less the peak with it.
  std::vector<std::pair<std::string, int64_t>> option_savings;
  // The step's predicted time per rank (fsdpx/framework/engine/step_time.h), on `time_hardware`;
  // or, when none, why in `time_not_predicted`. `peak_flops` per rank: the hardware's dense rate in
  // the compute dtype, which the predicted MFU is against.
  StepTime time;
  std::string time_hardware, time_not_predicted;
  double peak_flops = 0;
  // A cluster file's accelerators per node and memory per accelerator (0: this machine), which
  // the plan's topology and peak are checked against (a warning each where they do not fit).
  int hardware_per_node = 0;
  int64_t hardware_memory = 0;
  double tokens_per_second() const { return time.predicted() ? static_cast<double>(tokens_per_step) / time.step : 0; }
  double mfu() const;

  std::string text() const;  // the dry-run report
};

// The components a plan made, handed to the run that follows it, so that a process makes each
// once. The data source is not among them: the plan opens an instance of its own as rank 0 would
// (DataSource::open: once per instance), and the run opens its rank's.
struct PlannedComponents {
  std::shared_ptr<Model> model;
  std::shared_ptr<WrapPolicy> wrap;
  std::shared_ptr<Optimizer> optimizer;
  std::shared_ptr<PrecisionPolicy> precision;
  std::shared_ptr<CheckpointBackend> checkpoint;  // null without a checkpoint component
};

// Resolves and checks every component of `config` against `settings` for `topology` (the data
// source is opened, so a missing file or a batch larger than the data set is caught here), and
// plans the run. Throws fsdpx::Error naming what is wrong. With `made`, hands over the components
// it made.
FSDPX_API RunPlan plan_run(const PluginHost& host, const RunConfig& config, const TrainSettings& settings,
                           const Topology& topology, PlannedComponents* made = nullptr);

// The plan as JSON (plan.json in a run directory; exact byte counts for tools and tests).
FSDPX_API void write_plan_json(const RunPlan& plan, const std::string& path);

// Where a run's planned bytes live, and whether they fit there, before anything is allocated.
// The device: the step's peak per rank against what the device can give (CUDA's free memory,
// sim's budget FSDPX_SIM_MEMORY per process; on the CPU the device is the host). The host: the
// bytes held in host memory per rank (cpu_offload's shards, gradient shards and optimizer state;
// the step's peak too where device memory is host memory: the CPU, sim) against
// available_memory().
struct FSDPX_API MemorySide {
  int ranks = 0;           // ranks whose bytes this side holds; 0: not a side of its own
  int64_t per_rank = 0;    // planned bytes per rank
  std::string what;        // what per_rank is made of
  int64_t available = -1;  // bytes it can give; -1: not known here, so not checked
  std::string source;      // where `available` was read, or why it was not
  int64_t planned() const { return static_cast<int64_t>(ranks) * per_rank; }
  bool fits() const { return ranks == 0 || available < 0 || planned() <= available; }
};

struct FSDPX_API MemoryFit {
  std::string device_name;  // "sim", "cuda:1", "cpu"
  MemorySide device, host;
  bool fits() const { return device.fits() && host.fits(); }
  // --dry-run's lines: each side's planned and available bytes, and its verdict.
  std::string text() const;
  // One line: "the plan does not fit this node: ", each side's bytes, and the ways out.
  std::string refusal(const RunPlan& plan) const;
};

// Before any rank starts (fsdpx-train's launcher with `local_ranks` = --nproc-per-node, and
// --dry-run): the host side counts `process_bytes` per rank besides the plan's (what a process
// holds: LibTorch's code, the plugins). The device side is sim's budget, read by sim itself (sim
// is opened here when FSDPX_SIM_MEMORY is set); CUDA is never initialised here (a launcher must not
// before it forks its workers), so its side is left to each rank (memory_fit_in_rank).
FSDPX_API MemoryFit memory_fit_before_launch(const RunPlan& plan, int local_ranks, int64_t process_bytes);

// In a rank that opened `device`, once every rank of the job runs (after the rendezvous): the
// device's free memory for the local ranks that share it (CUDA; sim's budget is per process), and,
// when `check_host`, the host's available memory for the topology's local ranks (all of them
// resident by then: their processes' bytes are out of the available memory already).
FSDPX_API MemoryFit memory_fit_in_rank(const RunPlan& plan, const DeviceRuntime& device, const Topology& topology,
                                       bool check_host);

// Throws fsdpx::Error with fit.refusal(plan) when either side does not fit.
FSDPX_API void check_memory_fits(const RunPlan& plan, const MemoryFit& fit);

// Refuses an optimizer that declares it cannot step on the CPU (fsdpx/capabilities.h): this
// build's engine computes there.
FSDPX_API void check_optimizer_runs_here(const RunPlan& plan);

}  // namespace fsdpx
