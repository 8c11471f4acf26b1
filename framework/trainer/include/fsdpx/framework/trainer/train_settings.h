// TrainSettings: fsdpx-train's own options (top-level keys of a run's INI file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <boost/program_options/options_description.hpp>
#include <boost/program_options/variables_map.hpp>

#include "fsdpx/export.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/runtime/process_groups.h"

namespace fsdpx {

// What recomputes and what moves by layer type (fsdpx-train's --activation-checkpointing and
// --activation-offload): the units of these types. The library has none: it chooses per unit,
// through the wrap's activation_checkpointing and ShardOptions::activation_offload.
struct LayerTypeChoices {
  std::vector<std::string> recompute;  // these layer types' units recompute their activations
  std::vector<std::string> offload;    // and these ones' inputs go to host memory
};

// The trainer's own settings (fsdpx-train's host options).
struct FSDPX_API TrainSettings {
  int64_t steps = 100;
  int64_t batch_size = 8;  // samples per rank per micro-batch
  int64_t grad_accum = 1;  // micro-batches per step
  uint64_t seed = 0;       // parameters, data order
  DeviceKind device = DeviceKind::Cpu;  // --device: where the plan's device bytes live (device_spec: its word)
  std::string out_dir;     // metrics.jsonl, config.ini, summary.json, plot, checkpoints; "" = none
  int64_t log_every = 10;
  std::string lr_schedule = "constant";  // or "cosine"
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;
  double clip_grad_norm = 0;  // 0 = off
  double peak_tflops = 0;     // per rank; 0 = measure (CPU) or unknown
  int64_t eval_every = 0;     // held-out evaluation every N steps (0: at the end only)
  bool overlap = true;
  // Bitwise-identical losses and weights at every world size and strategy (EngineOptions::
  // deterministic): one sample per forward, one thread per rank, sums in global-sample order.
  bool deterministic = false;
  // The optimizer step inside backward (EngineOptions::step_in_backward): each unit's shards are
  // updated once its gradients are reduced, and its gradient shard freed at once.
  bool optimizer_in_backward = false;
  std::vector<std::string> checkpoint_layer_types;  // recompute these layer types' activations
  std::vector<std::string> offload_layer_types;     // and move these ones' inputs to host memory
  LayerTypeChoices layer_type_choices() const { return {checkpoint_layer_types, offload_layer_types}; }
  int64_t max_memory_mib = 0;  // stop when a rank's peak RSS in a step exceeds this (0: no limit)
  int64_t profile_step = 0;    // rank 0 profiles this step (1-based; 0: none): profile.json
  bool progress_bar = false;  // rank 0 draws a bar on its terminal instead of log lines
  // The memory check every rank agrees on after the rendezvous (run_plan.h's MemoryFit): off
  // with --skip-memory-check; its host side is left out where the launcher that started this
  // rank checked the node's memory for every rank before starting them (command line only).
  bool check_memory = true;
  bool host_memory_checked = false;
  // Checkpoints (the [checkpoint] component writes them).
  int64_t save_every = 0;     // 0 = only at the end (when a checkpoint component is chosen)
  int64_t keep_last = 0;      // 0 = keep all
  std::string resume;         // "", "auto" (the newest under OUT/checkpoints), or a directory
  // Initial weights: read from a safetensors file (or a directory holding model.safetensors)
  // instead of the seeded initialisation; and/or written, whole, to DIR/model.safetensors.
  std::string init_from, save_init;
  // The accelerators the plan predicts the step's time on (hardware.h's cluster file); "": this
  // machine's CPU, probed.
  std::string cluster;

  // Reads (and so marks read) the values fsdpx-train's options() declared. Throws fsdpx::Error
  // naming a bad value.
  static TrainSettings from(const HostValues& vm);
  // The host options, for --help and RunConfig.
  static boost::program_options::options_description options();
  // The settings as top-level INI lines (they reproduce the run with the components' sections).
  std::string to_ini() const;
};

}  // namespace fsdpx
