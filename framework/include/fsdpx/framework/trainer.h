// The trainer: a run composed from plugins (model, data, sharding, wrap, precision, optimizer,
// checkpoint), its plan before anything is allocated, and the training loop with the metrics a
// user reads. fsdpx-train is its command line.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/program_options/options_description.hpp>

#include "fsdpx/export.h"
#include "fsdpx/framework/plugin_host.h"
#include "fsdpx/framework/process_groups.h"
#include "fsdpx/framework/run_config.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/sharding_strategy.h"
#include "fsdpx/topology.h"

namespace fsdpx {

// The trainer's own settings (fsdpx-train's host options).
struct FSDPX_API TrainSettings {
  int64_t steps = 100;
  int64_t batch_size = 8;  // samples per rank per micro-batch
  int64_t grad_accum = 1;  // micro-batches per step
  uint64_t seed = 0;       // parameters, data order
  std::string out_dir;     // metrics.jsonl, config.ini, summary.json, plot, checkpoints; "" = none
  int64_t log_every = 10;
  std::string lr_schedule = "constant";  // or "cosine"
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;
  double clip_grad_norm = 0;  // 0 = off
  double peak_tflops = 0;     // per rank; 0 = measure (CPU) or unknown
  int64_t eval_every = 0;     // held-out evaluation every N steps (0: at the end only)
  bool overlap = true;
  std::vector<std::string> checkpoint_layer_types;  // recompute these layer types' activations
  int64_t max_memory_mib = 0;  // stop when a rank's peak RSS in a step exceeds this (0: no limit)
  bool progress_bar = false;  // rank 0 draws a bar on its terminal instead of log lines
  // Checkpoints (the [checkpoint] component writes them).
  int64_t save_every = 0;     // 0 = only at the end (when a checkpoint component is chosen)
  int64_t keep_last = 0;      // 0 = keep all
  std::string resume;         // "", "auto" (the newest under OUT/checkpoints), or a directory

  // Reads the values fsdpx-train's options() declared. Throws fsdpx::Error naming a bad value.
  static TrainSettings from(const boost::program_options::variables_map& vm);
  // The host options, for --help and RunConfig.
  static boost::program_options::options_description options();
  // The settings as top-level INI lines (they reproduce the run with the components' sections).
  std::string to_ini() const;
};

// What a run will hold and move per step on each rank, computed from the model's shapes and the
// strategy, precision and optimizer without allocating the model or forming a process group.
struct UnitBytes {
  std::string fqn;
  int64_t params = 0;         // parameter elements gathered with this unit
  int64_t shard_numel = 0;    // elements of this rank's flat shard (padded)
  int64_t unsharded_bytes = 0;  // the gathered unit in the compute dtype (0 when it is the shard)
  bool reshard_after_forward = false;
  bool recompute = false;       // activation checkpointing
};

struct FSDPX_API RunPlan {
  Topology topology;
  ShardingLayout layout;
  std::string strategy, wrap, precision, optimizer, model, data;
  PrecisionSpec dtypes;
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
  int64_t samples_per_step = 0, tokens_per_step = 0;
  double flops_per_token = 0;
  bool optimizer_runs_on_cpu = true;  // fsdpx/capabilities.h

  std::string text() const;  // the dry-run report
};

// Resolves and checks every component of `config` against `settings` for `topology` (the data
// source is opened, so a missing file or a batch larger than the data set is caught here), and
// plans the run. Throws fsdpx::Error naming what is wrong.
FSDPX_API RunPlan plan_run(const PluginHost& host, const RunConfig& config, const TrainSettings& settings,
                           const Topology& topology);

// The plan as JSON (plan.json in a run directory; exact byte counts for tools and tests).
FSDPX_API void write_plan_json(const RunPlan& plan, const std::string& path);

// Refuses an optimizer that declares it cannot step on the CPU (fsdpx/capabilities.h): this
// build's engine computes there.
FSDPX_API void check_optimizer_runs_here(const RunPlan& plan);

// Trains. Collective: every rank calls it with the same configuration. Returns the exit status.
FSDPX_API int train(const PluginHost& host, const RunConfig& config, const TrainSettings& settings,
                    const RuntimeOptions& runtime);

// The components a run uses when the configuration does not choose one.
FSDPX_API std::map<Kind, std::string> default_components();

}  // namespace fsdpx
