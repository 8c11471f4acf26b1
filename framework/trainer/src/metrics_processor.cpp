#include "metrics_processor.h"

#include <algorithm>
#include <cstdio>

#include <ATen/ops/full.h>

#include "format.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/every_rank.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "peak_flops.h"
#include "plan_json.h"
#include "proc_memory.h"
#include "rank_zero.h"
#include "seconds_since.h"

using json = nlohmann::json;

namespace fsdpx {

PersistentBytes persistent_bytes(const ShardingEngine& engine, const Optimizer& opt,
                                 const std::vector<ParamShard>& shards) {
  const MemoryReport mem = engine.memory();
  PersistentBytes b{mem.param_bytes, mem.grad_bytes, 0};
  for (const auto& p : shards)
    if (p.param.requires_grad())
      for (const auto& [key, t] : opt.state(p.name))
        if (t.dim() > 0) b.optimizer += t.numel() * t.element_size();
  return b;
}

namespace {

json phase_peaks(const WorldStep& w) {
  json j = json::object();
  for (int k = 0; k < kStepPhases; ++k) j[phase_name(static_cast<StepPhase>(k))] = w.max_phase_peaks[k];
  return j;
}

std::string eval_line(const json& e) {
  char l[160];
  std::snprintf(l, sizeof l, "eval at step %ld: held-out loss %.4f", static_cast<long>(e["step"].get<int64_t>()),
                e["eval_loss"].get<double>());
  std::string line = l;
  if (e.contains("eval_accuracy")) {
    std::snprintf(l, sizeof l, ", accuracy %.2f%%", 100 * e["eval_accuracy"].get<double>());
    line += l;
  }
  std::snprintf(l, sizeof l, " over %ld samples", static_cast<long>(e["eval_samples"].get<int64_t>()));
  return line + l;
}

// Per rank, each phase's seconds per step (StepClock's definition, fsdpx/framework/runtime/step_clock.h).
json breakdown_json(const std::vector<StepBreakdown>& ranks) {
  json all = json::array();
  for (const StepBreakdown& b : ranks) {
    json r = json::object();
    const std::vector<double> v = b.values();
    for (size_t i = 0; i < v.size(); ++i) r[StepBreakdown::names()[i]] = v[i];
    all.push_back(r);
  }
  return all;
}

// "time per step (mean over N ranks): forward 12.3 ms, backward ..., other 0.4 ms".
std::string breakdown_line(const std::vector<StepBreakdown>& run) {
  std::vector<double> mean(StepBreakdown::names().size(), 0.0);
  for (const StepBreakdown& b : run) {
    const std::vector<double> v = b.per_step().values();
    for (size_t i = 0; i < v.size(); ++i) mean[i] += v[i] / static_cast<double>(run.size());
  }
  std::string line = "time per step (mean over " + std::to_string(run.size()) + " rank" + (run.size() == 1 ? "" : "s") +
                     "):";
  for (size_t i = 0; i < mean.size(); ++i) {
    char part[64];
    std::snprintf(part, sizeof part, "%s %s %.1f ms", i ? "," : "", StepBreakdown::names()[i], mean[i] * 1e3);
    line += part;
  }
  return line;
}

}  // namespace

void MetricsProcessor::add_breakdowns(const WorldStep& w) {
  if (breakdown_run_.size() != w.breakdowns.size()) breakdown_run_.assign(w.breakdowns.size(), StepBreakdown{});
  for (size_t r = 0; r < w.breakdowns.size(); ++r) {
    std::vector<double> sum = breakdown_run_[r].values();
    const std::vector<double> add = w.breakdowns[r].values();  // seconds per step over this interval
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += add[i] * static_cast<double>(interval_.steps);
    breakdown_run_[r] = StepBreakdown::from_values(sum, breakdown_run_[r].steps + interval_.steps);
  }
}

MetricsProcessor::MetricsProcessor(const TrainSettings& settings, const RunPlan& plan, RunDirectory& run_dir,
                                   Reporter& out, Communicator& world, const DeviceRuntime& device,
                                   Clock::time_point wall_start)
    : s_(settings),
      plan_(plan),
      run_dir_(run_dir),
      out_(out),
      world_(world),
      device_(device),
      wall_start_(wall_start) {}

void MetricsProcessor::open(int64_t start_step) {
  start_step_ = start_step;
  on_rank_zero(world_, [&] { run_dir_.open_metrics(start_step); });
}

void MetricsProcessor::measure_peak_flops() {
  peak_ = s_.peak_tflops;
  if (peak_ > 0) return;
  world_.barrier().wait();
  const PeakProbe probe = measure_peak_tflops(plan_.dtypes.compute, device_);
  device_.reset_peak_memory();  // the probe's matrices (768 MiB on a GPU) are not the run's
  // The ranks' mean rate, and how many ranks could not probe (too little device memory free).
  at::Tensor p = at::full({2}, 0.0, at::kDouble);
  p.data_ptr<double>()[0] = probe.tflops;
  p.data_ptr<double>()[1] = probe.n == 0 ? 1.0 : 0.0;
  world_.all_reduce(p, ReduceOp::Sum).wait();
  const auto unmeasured = static_cast<int>(p.data_ptr<double>()[1]);
  peak_ = unmeasured > 0 ? 0.0 : p.data_ptr<double>()[0] / world_.size();
  if (unmeasured > 0)
    peak_source_ = "not measured: " + std::to_string(unmeasured) +
                   " rank(s) had too little device memory free for 256^3 matmuls; no MFU is reported; "
                   "--peak-tflops sets it";
  else
    peak_source_ = "measured in " + dtype_name(plan_.dtypes.compute) + " on every rank at once: " + probe.text() +
                   "; --peak-tflops sets it";
}

void MetricsProcessor::announce() {
  if (!writer()) return;
  char l[256];
  std::snprintf(l, sizeof l,
                "training %s (%s parameters) on %s: %d rank(s) of %d thread(s), %s, %s, %s, %s; %ld samples per step",
                plan_.model.c_str(), human_count(static_cast<double>(plan_.total_params)).c_str(), plan_.data.c_str(),
                world_.size(), plan_.threads.threads, plan_.strategy.c_str(), plan_.wrap.c_str(),
                plan_.precision.c_str(), plan_.optimizer.c_str(), static_cast<long>(plan_.samples_per_step));
  out_.line(l);
  if (peak_ > 0) {
    std::snprintf(l, sizeof l, "peak %.3f TFLOP/s per rank (%s)", peak_, peak_source_.c_str());
    out_.line(l);
  } else {
    out_.line("peak TFLOP/s per rank " + peak_source_);
  }
  for (const auto& w : plan_.warnings) out_.line("warning: " + w);
  for (const auto& what : plan_.not_applied) out_.line("not applied: " + what);
  if (plan_.layout.offloads(device_.is_cpu()))
    out_.line("cpu offload: shards, gradients and optimizer state in pinned host memory; " + device_.name() +
              " holds the gathered units, and the optimizer steps on the CPU");
}

void MetricsProcessor::start() {
  run_peak_ = std::max(peak_rss_bytes(), proc_memory().hwm);  // VmHWM restarts every step
  train_start_ = Clock::now();
  interval_ = Interval{};
  interval_.comm_start = counters_.totals();
}

RankStep MetricsProcessor::begin_step() {
  step_comm_start_ = counters_.totals();
  const ProcMemory before = proc_memory();
  run_peak_ = std::max(run_peak_, before.hwm);  // evaluations and saves since the last step
  rss_measured_ = reset_peak_rss() && before.rss >= 0;
  step_rss_start_ = before.rss;
  const MemoryStats since_last = device_.memory_stats();  // evaluations and saves since the last step
  allocated_run_peak_ = std::max(allocated_run_peak_, since_last.peak_allocated);
  reserved_run_peak_ = std::max(reserved_run_peak_, since_last.peak_reserved);
  RankStep mine;
  mine.allocated.begin(device_);
  step_faults_start_ = minor_page_faults();
  return mine;
}

WorldStep MetricsProcessor::end_step(int64_t step, RankStep& mine, double ordered_loss) {
  mine.allocated.end(StepPhase::Optimizer);
  reserved_run_peak_ = std::max(reserved_run_peak_, mine.allocated.reserved_peak());
  allocated_run_peak_ = std::max(allocated_run_peak_, mine.allocated.step_peak());
  mine.allocated_run_peak = allocated_run_peak_;
  step_comm_ = counters_.totals() - step_comm_start_;
  mine.step_peak = proc_memory().hwm;
  run_peak_ = std::max(run_peak_, mine.step_peak);
  mine.rss_rise = rss_measured_ ? mine.step_peak - step_rss_start_ : -1;
  mine.run_peak = run_peak_;
  const int64_t faults = minor_page_faults();
  mine.minor_faults = faults >= 0 && step_faults_start_ >= 0 ? faults - step_faults_start_ : -1;
  WorldStep w = gather_step(world_, mine);
  if (s_.deterministic) {  // its passes read every sample's loss already
    w.losses = {ordered_loss};
    w.loss = ordered_loss;
  }
  max_step_rise_ = std::max(max_step_rise_, w.max_rss_rise);
  check_step(step, w);
  if (!w.losses.empty()) {
    if (std::isnan(first_loss_)) first_loss_ = w.losses.front();
    last_loss_ = w.losses.back();
  }
  ++interval_.steps;
  interval_.tokens += w.tokens;
  interval_.samples += w.samples;
  return w;
}

void MetricsProcessor::check_step(int64_t step, const WorldStep& w) const {
  if (s_.max_memory_mib > 0 && w.max_allocated_peak > s_.max_memory_mib * (int64_t{1} << 20))
    throw Error(
        "step " + std::to_string(step + 1) + " reached a peak of " + std::to_string(w.max_allocated_peak >> 20) +
        " MiB allocated on a rank (the plan's measure), over --max-memory-mib " + std::to_string(s_.max_memory_mib) +
        "; lower --batch-size, or recompute activations (--activation-checkpointing)");
  // The losses read at this step are those of the steps since the last read, this one last.
  const int64_t first = step + 1 - static_cast<int64_t>(w.losses.size()) + 1;
  for (size_t i = 0; i < w.losses.size(); ++i)
    if (!std::isfinite(w.losses[i]))
      throw Error("the loss is " + std::to_string(w.losses[i]) + " at step " +
                  std::to_string(first + static_cast<int64_t>(i)) +
                  "; training diverged: lower the optimizer's lr (--optimizer.lr), add --warmup-steps or "
                  "--clip-grad-norm");
}

bool MetricsProcessor::logs_at(int64_t done) const { return done % s_.log_every == 0 || done == s_.steps; }

void MetricsProcessor::log(int64_t done, const WorldStep& w, double lr, double grad_norm,
                           const LossScalingGuard& scaling) {
  const bool log_now = logs_at(done);
  const double elapsed = seconds_since(interval_.start);
  const bool tokens_matter = plan_.tokens_per_step != plan_.samples_per_step;
  Progress p;
  p.step = done;
  p.loss = last_loss_;  // the last read (at log steps only: reading it waits for the device)
  p.lr = lr;
  p.step_time = elapsed / static_cast<double>(interval_.steps);
  p.per_s = static_cast<double>(tokens_matter ? interval_.tokens : interval_.samples) / std::max(elapsed, 1e-9);
  p.unit = tokens_matter ? "tok" : "samples";
  p.eta = seconds_since(train_start_) / static_cast<double>(done - start_step_) * static_cast<double>(s_.steps - done);
  if (!saves_.empty()) {
    p.ckpt_stall = saves_.back().stall_s;
    p.ckpt_write = saves_.back().write_s;
  }
  if (!log_now) {
    if (!writer()) return;
    p.peak_mem = allocated_run_peak_;
    out_.update(p, false);
    return;
  }
  add_breakdowns(w);
  on_rank_zero(world_, [&] {
    p.peak_mem = *std::max_element(w.allocated_run_peaks.begin(), w.allocated_run_peaks.end());
    run_dir_.append_metrics(metrics_line(done, w, elapsed, p.step_time, lr, grad_norm, scaling).dump());
    out_.update(p, true);
  });
  interval_ = Interval{};
  interval_.comm_start = counters_.totals();
}

json MetricsProcessor::metrics_line(int64_t done, const WorldStep& w, double elapsed, double step_time, double lr,
                                    double grad_norm, const LossScalingGuard& scaling) const {
  const double secs = std::max(elapsed, 1e-9);
  json m{{"step", done},
         {"loss", w.loss},
         {"lr", lr},
         {"tokens_per_s", static_cast<double>(interval_.tokens) / secs},
         {"samples_per_s", static_cast<double>(interval_.samples) / secs},
         {"step_time_s", step_time},
         {"peak_memory_bytes", w.allocated_run_peaks},
         {"memory_kind", "allocated"},
         {"step_peak_allocated_bytes", w.max_allocated_peak},
         {"step_peak_reserved_bytes", w.max_reserved_peak},
         {"phase_peak_allocated_bytes", phase_peaks(w)},
         {"peak_rss_bytes", w.run_peaks},
         {"step_rss_rise_bytes", w.max_rss_rise},
         {"minor_faults_per_step", w.minor_faults}};  // per rank, of the logged step
  m.update((counters_.totals() - interval_.comm_start).per(interval_.steps).to_json());
  if (plan_.flops_per_token > 0) {
    // The model plugin's own count of training FLOPs per token, with its definition beside it (the
    // decoder models count as torchtitan does, so that MFU compares with torchtitan's figures).
    const double tflops = plan_.flops_per_token * static_cast<double>(interval_.tokens) / secs / 1e12;
    m["flops_per_token"] = plan_.flops_per_token;
    m["flops_definition"] =
        "the model plugin's flops_per_token(); decoders: torchtitan's 6*N_non_embedding + 12*L*H*Q*T";
    m["tflops"] = tflops;
    if (peak_ > 0) m["mfu"] = tflops / (peak_ * world_.size());
  }
  m["step_breakdown_s"] = breakdown_json(w.breakdowns);
  if (grad_norm >= 0) m["grad_norm"] = grad_norm;
  if (scaling.active()) {
    m["loss_scale"] = scaling.scale();  // for the next step
    m["skipped_steps"] = scaling.skipped_steps();
  }
  return m;
}

void MetricsProcessor::log_eval(const json& record) {
  last_eval_ = record;
  on_rank_zero(world_, [&] {
    out_.line(eval_line(record));
    run_dir_.append_metrics(record.dump());
  });
}

void MetricsProcessor::log_checkpoint(const SaveFigures& f) {
  if (!writer()) return;
  saves_.push_back(f);
  run_dir_.append_metrics(json{{"step", f.step},
                               {"checkpoint", f.dir},
                               {"checkpoint_async", f.background},
                               {"checkpoint_stall_s", f.stall_s},
                               {"checkpoint_write_s", f.write_s},
                               {"checkpoint_wait_s", f.wait_s},
                               {"checkpoint_stage_s", f.stage_s},
                               {"checkpoint_stage_deferred", f.deferred},
                               {"checkpoint_staged_bytes", f.staged_bytes}}
                              .dump());
}

// summary.json's "checkpoints": the number of saves, their stall and write times.
static json checkpoints_json(const std::vector<SaveFigures>& saves) {
  double stall = 0, stall_max = 0, write_max = 0, wait = 0;
  for (const SaveFigures& f : saves) {
    stall += f.stall_s;
    stall_max = std::max(stall_max, f.stall_s);
    write_max = std::max(write_max, f.write_s);
    wait += f.wait_s;
  }
  return json{{"saves", saves.size()},          {"async", !saves.empty() && saves.back().background},
              {"stall_s_total", stall},         {"stall_s_max", stall_max},
              {"write_s_max", write_max},       {"wait_s_total", wait},
              {"last_stall_s", saves.empty() ? 0.0 : saves.back().stall_s},
              {"last_write_s", saves.empty() ? 0.0 : saves.back().write_s}};
}

void MetricsProcessor::finish(const PersistentBytes& mine, const std::string& last_checkpoint) {
  const json ranks = measured_per_rank(mine);
  on_rank_zero(world_, [&] {
    const double wall = seconds_since(wall_start_);
    const double steps_run = static_cast<double>(std::max<int64_t>(1, s_.steps - start_step_));
    json summary{{"steps", s_.steps},
                 {"start_step", start_step_},
                 {"first_loss", first_loss_},
                 {"final_loss", last_loss_},
                 {"world_size", world_.size()},
                 {"ranks", ranks},
                 {"last_step_comm", step_comm_.to_json()},
                 {"plan", plan_json(plan_)},
                 {"peak_tflops_per_rank", peak_},
                 {"max_step_rss_rise_bytes", max_step_rise_},
                 {"step_time_s", seconds_since(train_start_) / steps_run},
                 {"wall_s", wall}};
    if (!last_eval_.is_null()) summary["eval"] = last_eval_;
    std::vector<StepBreakdown> mean;
    for (const StepBreakdown& b : breakdown_run_) mean.push_back(b.per_step());
    if (!mean.empty()) summary["step_breakdown_s"] = breakdown_json(mean);
    if (!last_checkpoint.empty()) summary["checkpoint"] = last_checkpoint;
    if (!saves_.empty()) summary["checkpoints"] = checkpoints_json(saves_);
    run_dir_.write_summary(summary.dump(2));
    closing_lines(wall, last_checkpoint);
  });
}

json MetricsProcessor::measured_per_rank(const PersistentBytes& mine) {
  const auto all = from_every_rank(world_, std::vector<int64_t>{mine.params, mine.grads, mine.optimizer,
                                                                std::max(run_peak_, proc_memory().hwm),
                                                                allocated_run_peak_, reserved_run_peak_});
  json ranks = json::array();
  for (const auto& r : all)
    ranks.push_back({{"param_bytes", r[0]},
                     {"grad_bytes", r[1]},
                     {"optimizer_bytes", r[2]},
                     {"peak_rss_bytes", r[3]},
                     {"peak_allocated_bytes", r[4]},
                     {"peak_reserved_bytes", r[5]},
                     {"memory_device", device_.name()}});
  return ranks;
}

void MetricsProcessor::closing_lines(double wall, const std::string& last_checkpoint) {
  char l[200];
  std::snprintf(l, sizeof l, "done: %ld steps in %.1f s, loss %.4f -> %.4f", static_cast<long>(s_.steps - start_step_),
                wall, first_loss_, last_loss_);
  out_.line(l);
  if (!breakdown_run_.empty()) out_.line(breakdown_line(breakdown_run_));
  if (!saves_.empty()) {
    const json c = checkpoints_json(saves_);
    std::snprintf(l, sizeof l,
                  "checkpoints: %zu save(s)%s, stall %.3f s in all (at most %.3f s), written in at most %.2f s",
                  saves_.size(), c["async"].get<bool>() ? " in the background" : "", c["stall_s_total"].get<double>(),
                  c["stall_s_max"].get<double>(), c["write_s_max"].get<double>());
    out_.line(l);
  }
  if (run_dir_.dir().empty()) return;
  out_.line("metrics:    " + run_dir_.path("metrics.jsonl"));
  out_.line("config:     " + run_dir_.path("config.ini"));
  out_.line("plot:       scripts/fsdpx-plot " + run_dir_.dir() + "  (writes " + run_dir_.path("plot.png") + ")");
  if (!last_checkpoint.empty()) out_.line("checkpoint: " + last_checkpoint);
}

}  // namespace fsdpx
