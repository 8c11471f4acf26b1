// RunPlan: what a run will hold and move, before anything is allocated (--dry-run, plan.json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdpx/export.h"
#include "fsdpx/framework/engine/memory_plan.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/sharding_strategy.h"
#include "fsdpx/framework/runtime/cpu_resources.h"
#include "fsdpx/topology.h"

namespace fsdpx {

// What a run will hold and move per step on each rank, computed from the model's shapes and the
// strategy, precision and optimizer without allocating the model or forming a process group.
struct UnitBytes {
  std::string fqn;
  int64_t params = 0;         // parameter elements gathered with this unit
  int64_t shard_numel = 0;    // elements of this rank's flat shard (padded)
  int64_t unsharded_bytes = 0;  // the gathered unit in the compute dtype (0 when it is the shard)
  bool reshard_after_forward = false;
  bool recompute = false;       // activation checkpointing
  PrecisionSpec dtypes;         // the precision policy's answer for this unit
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
  std::string device = "cpu";        // where the engine computes: memory.peak is that device's
  ThreadChoice threads;               // intra-op threads per rank, and why
  bool deterministic = false;         // --deterministic: its gradient exchange is all_to_all_bytes
  std::vector<std::string> warnings;  // what will make the run slow (printed by the plan and the run)
  // The step's predicted bytes per rank, allocated (fsdpx/framework/engine/memory_plan.h), and
  // whether the model stated its activations (fsdpx/activation_memory.h); without, none counted.
  StepMemory memory;
  bool activations_stated = false;

  std::string text() const;  // the dry-run report
};

// Resolves and checks every component of `config` against `settings` for `topology` (the data
// source is opened, so a missing file or a batch larger than the data set is caught here), and
// plans the run. Throws fsdpx::Error naming what is wrong.
FSDPX_API RunPlan plan_run(const PluginHost& host, const RunConfig& config, const TrainSettings& settings,
                           const Topology& topology);

// The plan as JSON (plan.json in a run directory; exact byte counts for tools and tests).
FSDPX_API void write_plan_json(const RunPlan& plan, const std::string& path);

// Refuses a run whose ranks on one node cannot fit: `local_ranks` x (the plan's peak per rank +
// `process_bytes`, what a process holds besides: LibTorch's code, the plugins) against
// available_memory(). Throws fsdpx::Error naming the planned and the available bytes and the ways
// out; does nothing when the available memory cannot be read.
FSDPX_API void check_memory_fits(const RunPlan& plan, int local_ranks, int64_t process_bytes);

// Refuses an optimizer that declares it cannot step on the CPU (fsdpx/capabilities.h): this
// build's engine computes there.
FSDPX_API void check_optimizer_runs_here(const RunPlan& plan);

}  // namespace fsdpx
