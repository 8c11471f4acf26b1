// MetricsProcessor: what a run measures and reports (torchtitan's MetricsProcessor): each step's
// memory and bytes moved, agreed over the ranks; the progress line or bar, metrics.jsonl,
// the opening lines, summary.json and the closing lines.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm_counters.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/framework/trainer/checkpoint_saver.h"
#include "fsdpx/framework/trainer/run_directory.h"
#include "fsdpx/framework/trainer/run_plan.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "loss_scaling_guard.h"
#include "reporter.h"
#include "world_step.h"

namespace fsdpx {

class ShardingEngine;

// This rank's persistent bytes at the end of a run: parameter, gradient and optimizer shards.
struct PersistentBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
};
// Read from the engine's shards and the optimizer's state of `shards` (state of dim 0, e.g. a step
// count, is not per element and is left out, as the plan leaves it out).
PersistentBytes persistent_bytes(const ShardingEngine& engine, const Optimizer& opt,
                                 const std::vector<ParamShard>& shards);

class MetricsProcessor {
 public:
  using Clock = std::chrono::steady_clock;
  // Every reference outlives it. `world`: every rank (its collectives are not counted);
  // `wall_start`: when the run began, for summary.json's wall time.
  MetricsProcessor(const TrainSettings& settings, const RunPlan& plan, RunDirectory& run_dir, Reporter& out,
                   Communicator& world, const DeviceRuntime& device, Clock::time_point wall_start);

  // The engine's counted communicators are added here.
  CommCounters& counters() { return counters_; }

  // metrics.jsonl for a run starting at `start_step` (rank 0; every rank learns the outcome).
  void open(int64_t start_step);
  // The peak for MFU: --peak-tflops, or measured by every rank at once and averaged. Collective.
  void measure_peak_flops();
  // Rank 0's opening lines: what trains where, the peak, the plan's warnings.
  void announce();
  // The loop begins: the run's peaks so far and the first interval.
  void start();

  // A step: begin_step() before its first forward returns the rank's figures to fill (losses,
  // tokens, samples, the allocated peak of each phase); end_step() after the optimizer agrees on
  // them over every rank. end_step throws fsdpx::Error on a diverged loss (of any step whose loss
  // it reads) or a step over --max-memory-mib. `ordered_loss`: --deterministic's loss, the same
  // bits on every rank, read every step.
  RankStep begin_step();
  WorldStep end_step(int64_t step, RankStep& mine, double ordered_loss);
  // Whether step `done` (1-based) writes a metrics line: the losses are read from the device then.
  bool logs_at(int64_t done) const;

  // The progress line or bar of step `done`; at log steps also metrics.jsonl, and a new interval.
  void log(int64_t done, const WorldStep& w, double lr, double grad_norm, const LossScalingGuard& scaling);
  // A held-out evaluation's record: its line and metrics.jsonl; summary.json keeps the last.
  void log_eval(const nlohmann::json& record);
  // Rank 0: a checkpoint's record in metrics.jsonl (checkpoint_stall_s, checkpoint_write_s,
  // checkpoint_wait_s); the progress line and the summary show them from then on. Local.
  void log_checkpoint(const SaveFigures& f);
  // summary.json and the closing lines, with every rank's bytes and peaks. Collective.
  void finish(const PersistentBytes& mine, const std::string& last_checkpoint);

 private:
  // The figures of the steps since the last log line.
  struct Interval {
    Clock::time_point start = Clock::now();
    int64_t steps = 0, tokens = 0, samples = 0;
    CommTotals comm_start;
  };
  bool writer() const { return world_.rank() == 0; }
  void check_step(int64_t step, const WorldStep& w) const;
  nlohmann::json metrics_line(int64_t done, const WorldStep& w, double elapsed, double step_time, double lr,
                              double grad_norm, const LossScalingGuard& scaling) const;
  nlohmann::json measured_per_rank(const PersistentBytes& mine);
  void closing_lines(double wall, const std::string& last_checkpoint);
  // Adds a log step's per-rank breakdown (seconds per step over the interval) to the run's.
  void add_breakdowns(const WorldStep& w);

  const TrainSettings& s_;
  const RunPlan& plan_;
  RunDirectory& run_dir_;
  Reporter& out_;
  Communicator& world_;
  const DeviceRuntime& device_;  // its allocator's bytes are the run's allocated bytes
  const Clock::time_point wall_start_;
  CommCounters counters_;
  int64_t start_step_ = 0;
  double peak_ = 0;
  std::string peak_source_ = "--peak-tflops";
  Clock::time_point train_start_;
  Interval interval_;
  // The step being measured: what it started from.
  CommTotals step_comm_start_;
  int64_t step_rss_start_ = -1;
  int64_t step_faults_start_ = -1;  // minor_page_faults() at the step's start
  bool rss_measured_ = false;
  // The run's figures so far.
  double first_loss_ = std::nan(""), last_loss_ = std::nan("");
  int64_t run_peak_ = 0, max_step_rise_ = 0;
  int64_t allocated_run_peak_ = 0;  // this rank's allocated peak so far (memory_accounting.h)
  int64_t reserved_run_peak_ = 0;   // the device allocator's reserved peak (the CPU's: allocated)
  CommTotals step_comm_;            // the last step's
  nlohmann::json last_eval_;
  std::vector<StepBreakdown> breakdown_run_;  // per rank: seconds per phase over the logged steps
  std::vector<SaveFigures> saves_;            // rank 0: the run's checkpoints, as log_checkpoint got them
};

}  // namespace fsdpx
