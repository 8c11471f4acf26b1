// The training loop, stage by stage: plan, build, restore, then per step forward, backward,
// clip, optimizer; log, evaluate, save; and the summary at the end.
#include "fsdpx/framework/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <filesystem>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include "components.h"
#include "fsdpx/evaluation.h"
#include "fsdpx/hf_interop.h"
#include "fsdpx/framework/base/fault_injection.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/runtime/collective_context.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "fsdpx/framework/trainer/checkpoint_state.h"
#include "fsdpx/framework/trainer/lr_schedule.h"
#include "fsdpx/framework/trainer/run_directory.h"
#include "format.h"
#include "metrics.h"
#include "peak_flops.h"
#include "plan_json.h"
#include "rank_zero.h"
#include "reporter.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace fsdpx {

std::map<Kind, std::string> default_components() {
  return {{Kind::Model, "gpt"},       {Kind::Data, "text"},      {Kind::Sharding, "full_shard"},
          {Kind::Wrap, "layer_type"}, {Kind::Precision, "fp32"}, {Kind::Optimizer, "adamw"}};
}

void check_device_trains(DeviceKind device) {
  if (device == DeviceKind::Cuda)
    throw Error("--device cuda: the sharding engine of this build computes on the CPU only (NCCL process groups are "
                "built and checked by --check-comm); use --device cpu");
}

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// {"step", "eval_loss", "eval_samples"[, "eval_accuracy"]} from the world's sums.
json eval_record(int64_t step, double loss_sum, double correct, double samples, bool has_accuracy) {
  json e{{"step", step}, {"eval_loss", loss_sum / samples}, {"eval_samples", static_cast<int64_t>(samples)}};
  if (has_accuracy) e["eval_accuracy"] = correct / samples;
  return e;
}

// Held-out evaluation over every rank: each rank evaluates its share of the held-out samples in
// chunks, all ranks running the same number of forwards (the units' gathers are collective).
// Returns {"step", "eval_loss", "eval_samples"[, "eval_accuracy"]}, or null when the model or the
// data cannot evaluate.
json evaluate_heldout(ShardingEngine& engine, Evaluable* evaluable, HeldOutData* heldout, Communicator& world,
                      int64_t batch_size, int64_t step) {
  if (!evaluable || !heldout || heldout->num_heldout() == 0) return json();
  at::NoGradGuard no_grad;
  const int rank = world.rank(), n_ranks = world.size();
  const int64_t n = heldout->num_heldout();
  const int64_t per_rank = (n + n_ranks - 1) / n_ranks;
  const int64_t chunk = std::max<int64_t>(1, batch_size * 4);
  double sums[3] = {0, 0, 0};
  bool has_accuracy = true;
  for (int64_t off = 0; off < per_rank; off += chunk) {
    const int64_t first = std::min(n, rank * per_rank + off);
    const int64_t last = std::min({n, rank * per_rank + per_rank, rank * per_rank + off + chunk});
    // A rank whose share is used up runs one sample and does not count it.
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
  world.all_reduce(t, ReduceOp::Sum).wait();
  return eval_record(step, t[0].item<double>(), t[1].item<double>(), t[2].item<double>(), t[3].item<double>() == 0);
}

// --deterministic's held-out evaluation: one sample per forward, rank r taking samples r, r + W,
// ...; every rank's sums gathered and added in sample order, so the figures have the same bits
// at every world size. Returns what evaluate_heldout returns.
json evaluate_heldout_in_order(ShardingEngine& engine, Evaluable* evaluable, HeldOutData* heldout, Communicator& world,
                               int64_t step) {
  if (!evaluable || !heldout || heldout->num_heldout() == 0) return json();
  at::NoGradGuard no_grad;
  const int rank = world.rank(), W = world.size();
  const int64_t n = heldout->num_heldout(), per_rank = (n + W - 1) / W;
  at::Tensor mine = at::zeros({per_rank, 3}, at::kDouble);  // loss sum, correct, samples
  double* m = mine.data_ptr<double>();
  for (int64_t j = 0; j < per_rank; ++j) {
    const int64_t i = j * W + rank;
    Batch b = heldout->heldout(i < n ? i : 0, 1);  // past the end: a forward all ranks run, not counted
    EvalSums r;
    engine.forward([&] {
      r = evaluable->evaluate(b);
      return at::zeros({}, at::kFloat);
    });
    if (i >= n) continue;
    m[3 * j] = r.loss_sum;
    m[3 * j + 1] = r.correct;
    m[3 * j + 2] = static_cast<double>(r.samples);
  }
  at::Tensor all = at::empty({W * per_rank * 3}, at::kDouble);
  world.all_gather(all, mine.reshape({-1})).wait();
  const double* a = all.data_ptr<double>();
  double sums[3] = {0, 0, 0};
  bool has_accuracy = true;
  for (int64_t i = 0; i < n; ++i) {
    const double* f = a + (i % W) * per_rank * 3 + (i / W) * 3;
    sums[0] += f[0];
    sums[1] += std::max(0.0, f[1]);
    sums[2] += f[2];
    has_accuracy = has_accuracy && f[1] >= 0;
  }
  return eval_record(step, sums[0], sums[1], sums[2], has_accuracy);
}

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

// The figures of the steps since the last log line.
struct Interval {
  Clock::time_point start = Clock::now();
  int64_t steps = 0, tokens = 0, samples = 0;
  CommTotals comm_start{};
};

class Trainer {
 public:
  Trainer(const PluginHost& host, const RunConfig& config, const TrainSettings& s, const RuntimeOptions& ro)
      : host_(host), config_(config), s_(s), ro_(ro), rank_(ro.topology.rank), world_(ro.topology.world_size),
        run_dir_(s.out_dir, rank_ == 0) {}

  int run() {
    plan();
    try {
      build();
      train();
    } catch (const std::exception& e) {
      // The other ranks stop with this message at once, instead of waiting in a collective.
      if (groups_) groups_->report_failure(message_of(e));
      throw;
    }
    return 0;
  }

 private:
  void train() {
    open_run_directory();
    initial_weights();
    restore();
    on_rank_zero(world(), [&] { run_dir_.open_metrics(start_step_); });
    measure_peak();
    announce();
    loop();
    finish();
  }

  bool writer() const { return rank_ == 0; }
  Communicator& world() const { return *groups_->world(); }

  void plan() {
    check_device_trains(ro_.device);
    if (s_.deterministic && at::get_cpu_capability() != "DEFAULT")
      throw Error("--deterministic needs ATen's unvectorised CPU kernels, and this process already chose " +
                  at::get_cpu_capability() + " ones: set ATEN_CPU_CAPABILITY=default before the first tensor operation "
                  "(fsdpx-train does so itself)");
    plan_ = plan_run(host_, config_, s_, ro_.topology);
    if (s_.max_memory_mib > 0 && !cpu_memory_accounting_installed())
      throw Error("--max-memory-mib checks the bytes LibTorch allocates, counted from the process's start "
                  "(install_cpu_memory_accounting(), which fsdpx-train calls first); this process did not install it");
    check_optimizer_runs_here(plan_);
    at::set_num_threads(plan_.threads.threads);
  }

  // Process groups, components, communicators (counted), the engine, the optimizer and the data.
  void build() {
    groups_ = ProcessGroups::create(ro_);
    model_ = make<Model>(host_, config_);
    data_ = make<DataSource>(host_, config_);
    auto wrap = make<WrapPolicy>(host_, config_);
    opt_ = make<Optimizer>(host_, config_);
    // A precision policy that needs loss scaling owns the scaler (fsdpx/loss_scaling.h).
    auto precision = make<PrecisionPolicy>(host_, config_);
    if (auto* scaling = dynamic_cast<LossScalingPolicy*>(precision.get())) scaler_ = scaling->make_scaler();
    if (plan_.dtypes.loss_scaling && !scaler_)
      throw Error("precision '" + plan_.precision + "' asks for loss scaling but offers no scaler (fsdpx/loss_scaling.h)");
    if (config_.choice(Kind::Checkpoint)) ckpt_ = make<CheckpointBackend>(host_, config_);
    EngineOptions eo;
    eo.layout = plan_.layout;
    eo.precision = plan_.dtypes;
    eo.unit_precision = [precision](const std::string& unit) { return precision->spec(unit); };
    eo.seed = s_.seed;
    eo.overlap = s_.overlap;
    eo.deterministic = s_.deterministic;
    engine_ = std::make_unique<ShardingEngine>(model_, select_units(*model_, *wrap, s_), engine_comms(eo.layout), eo);
    shards_ = engine_->shards();
    opt_->init(shards_);
    // Deterministic: every rank reads the whole global batch (as one rank would) and computes
    // the samples j * W + rank of it, so that its position is the same at every world size.
    if (s_.deterministic) data_->open(DataContext{0, 1, s_.batch_size * world_, s_.seed});
    else data_->open(DataContext{rank_, world_, s_.batch_size, s_.seed});
    schedule_ = LrSchedule::parse(s_.lr_schedule, opt_->base_lr(), s_.warmup_steps, s_.steps, s_.min_lr_ratio);
  }

  EngineComms engine_comms(const ShardingLayout& layout) {
    EngineComms comms;
    comms.world = groups_->world();
    const int S = layout.shard_group_size, R = layout.replicate_group_size;
    auto counted = [&](std::shared_ptr<Communicator> c) {
      auto wrapped = std::make_shared<CountingCommunicator>(std::move(c));
      counters_.add(wrapped);
      return wrapped;
    };
    if (S > 1 && R > 1) {
      auto h = groups_->hybrid(S);
      comms.shard = counted(h.shard);
      comms.replicate = counted(h.replicate);
    } else if (S > 1) {
      comms.shard = counted(groups_->world());
    } else if (R > 1) {
      comms.replicate = counted(groups_->world());
    }
    if (s_.deterministic) comms.world = counted(groups_->world());  // it carries the gradients then
    return comms;
  }

  void open_run_directory() {
    on_rank_zero(world(), [&] { run_dir_.create(s_.to_ini() + "\n" + config_.to_ini(), world_, plan_json(plan_).dump(2)); });
  }

  // --init-from, or a model's Hugging Face weights (--model.from_hf), replace the seeded
  // initialisation (a checkpoint to resume from replaces both); --save-init writes what the run
  // starts from.
  void initial_weights() {
    auto* hf = dynamic_cast<HuggingFaceModel*>(model_.get());
    const std::string hf_dir = hf ? hf->hf_weights_dir() : "";
    if (s_.init_from.empty() && s_.save_init.empty() && hf_dir.empty()) return;
    if (!hf_dir.empty() && !s_.init_from.empty())
      throw Error("--init-from " + s_.init_from + " and the model's Hugging Face weights (" + hf_dir +
                  ") both give the initial weights; keep one");
    CollectivePhase phase("checkpoint");
    CheckpointState st = weights_state(*engine_);
    const CheckpointContext ctx = checkpoint_context(*groups_, *engine_);
    if (!hf_dir.empty()) {
      load_hf_weights(hf_dir, st, ctx, [hf](const std::string& n) { return hf->hf_name(n); },
                      [hf](const std::string& n) { return hf->hf_ignorable(n); });
      if (writer()) std::printf("initial weights from the Hugging Face checkpoint %s\n", hf_dir.c_str());
    }
    if (!s_.init_from.empty()) {
      load_initial_weights(s_.init_from, st, ctx);
      if (writer()) std::printf("initial weights from %s\n", s_.init_from.c_str());
    }
    if (!s_.save_init.empty()) {
      std::filesystem::path dir = std::filesystem::absolute(s_.save_init).lexically_normal();
      if (dir.filename().empty()) dir = dir.parent_path();  // "DIR/"
      st.config_ini = s_.to_ini() + "\n" + config_.to_ini();  // what made these weights (export-hf reads [model])
      if (hf) st.trainer_state_json = json{{"hf_config", json::parse(hf->hf_config_json())}}.dump();
      save_consolidated(dir.string(), st, ctx, /*with_optimizer=*/false);
      if (writer()) std::printf("initial weights written to %s/model.safetensors\n", s_.save_init.c_str());
    }
  }

  // --resume: the named checkpoint, or the newest under OUT/checkpoints.
  void restore() {
    if (s_.resume.empty()) return;
    CollectivePhase phase("checkpoint");
    std::string dir = s_.resume;
    if (s_.resume == "auto") {
      // Rank 0 alone moves back what an interrupted save left aside; then every rank lists.
      on_rank_zero(world(), [&] { recover_interrupted_saves(run_dir_.checkpoints()); });
      auto latest = ckpt_->latest(run_dir_.checkpoints());
      dir = latest ? *latest : "";
      for (const auto& skipped : skipped_checkpoints(run_dir_.checkpoints()))  // never older without a word
        if (writer()) std::fprintf(stderr, "fsdpx: warning: --resume auto skips %s\n", skipped.c_str());
    }
    if (dir.empty()) {
      if (writer()) std::printf("no complete checkpoint under %s yet: starting from step 0\n", run_dir_.checkpoints().c_str());
      return;
    }
    CheckpointState st = checkpoint_state(*engine_, *opt_, /*for_load=*/true);
    ckpt_->load(dir, st, checkpoint_context(*groups_, *engine_));
    apply_checkpoint(st, *opt_, *data_);
    restore_scaler(st.trainer_state_json);
    start_step_ = st.step;
    if (writer()) std::printf("resumed from %s at step %ld\n", dir.c_str(), static_cast<long>(start_step_));
    if (start_step_ >= s_.steps)
      throw Error("the checkpoint " + dir + " is at step " + std::to_string(start_step_) + ", not before --steps " +
                  std::to_string(s_.steps) + "; raise --steps to train further");
  }

  // The loss scaler's state as the checkpoint recorded it (a checkpoint of a run without loss
  // scaling leaves the scaler as configured).
  void restore_scaler(const std::string& trainer_state) {
    if (!scaler_ || trainer_state.empty()) return;
    const json j = json::parse(trainer_state, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("loss_scaler")) return;
    const json& ls = j["loss_scaler"];
    if (!ls.is_object() || !ls.contains("state") || !ls.contains("skipped_steps") || !ls["skipped_steps"].is_number_integer())
      throw Error("the checkpoint's trainer state has a malformed \"loss_scaler\": " + ls.dump());
    scaler_->load_state(ls["state"].dump());
    skipped_steps_ = ls["skipped_steps"].get<int64_t>();
  }

  // The peak for MFU: --peak-tflops, or measured by every rank at once and averaged.
  void measure_peak() {
    peak_ = s_.peak_tflops;
    if (peak_ > 0) return;
    groups_->world()->barrier().wait();
    const PeakProbe probe = measure_peak_tflops(plan_.dtypes.compute);
    at::Tensor p = at::full({1}, probe.tflops, at::kDouble);
    groups_->world()->all_reduce(p, ReduceOp::Avg).wait();
    peak_ = p.item<double>();
    peak_source_ = "measured in " + dtype_name(plan_.dtypes.compute) + " on every rank at once: " + probe.text() +
                   "; --peak-tflops sets it";
  }

  void announce() {
    out_ = std::make_unique<Reporter>(writer() && s_.progress_bar, s_.steps);
    if (!writer()) return;
    char l[256];
    std::snprintf(l, sizeof l,
                  "training %s (%s parameters) on %s: %d rank(s) of %d thread(s), %s, %s, %s, %s; %ld samples per step",
                  plan_.model.c_str(), human_count(static_cast<double>(plan_.total_params)).c_str(), plan_.data.c_str(),
                  world_, plan_.threads.threads, plan_.strategy.c_str(), plan_.wrap.c_str(), plan_.precision.c_str(), plan_.optimizer.c_str(),
                  static_cast<long>(plan_.samples_per_step));
    out_->line(l);
    std::snprintf(l, sizeof l, "peak %.3f TFLOP/s per rank (%s)", peak_, peak_source_.c_str());
    out_->line(l);
    for (const auto& w : plan_.warnings) out_->line("warning: " + w);
    if (plan_.layout.offload_to_cpu)
      out_->line("cpu offload: the compute device is the CPU, where the shards, gradients and optimizer state already live; "
                 "nothing to move (the run is its base strategy's)");
  }

  void loop() {
    run_peak_ = std::max(peak_rss_bytes(), proc_memory().hwm);  // VmHWM restarts every step
    train_start_ = Clock::now();
    interval_ = Interval{};
    interval_.comm_start = counters_.totals();
    for (int64_t step = start_step_; step < s_.steps; ++step) {
      const WorldStep w = train_step(step);
      const int64_t done = step + 1;
      log(done, w);
      if (s_.eval_every > 0 && done % s_.eval_every == 0 && done != s_.steps) evaluate(done);
      if (ckpt_ && s_.save_every > 0 && done % s_.save_every == 0 && done != s_.steps) save(done);
    }
    evaluate(s_.steps);
    if (ckpt_) save(s_.steps);
  }

  // One optimizer step: forward and backward per micro-batch, clip, optimizer; then the figures
  // every rank agrees on. Throws on a diverged loss or a step over --max-memory-mib.
  WorldStep train_step(int64_t step) {
    lr_ = schedule_.at(step);
    const CommTotals comm_before = counters_.totals();
    const ProcMemory before = proc_memory();
    run_peak_ = std::max(run_peak_, before.hwm);  // evaluations and saves since the last step
    const bool measured = reset_peak_rss() && before.rss >= 0;
    allocated_run_peak_ = std::max(allocated_run_peak_, cpu_memory_stats().peak_allocated);  // since the last step
    RankStep mine;
    mine.allocated.begin();
    const double scale = scaler_ ? scaler_->scale() : 1.0;
    double ordered_loss = 0;
    if (s_.deterministic) ordered_loss = deterministic_passes(mine, scale);
    for (int64_t m = 0; m < s_.grad_accum && !s_.deterministic; ++m) {
      engine_->set_requires_gradient_sync(m == s_.grad_accum - 1);
      Batch b = data_->next();
      at::Tensor loss = engine_->forward([&] { return model_->loss(b) / static_cast<double>(s_.grad_accum); });
      mine.allocated.end(StepPhase::Forward);
      engine_->backward(scaler_ ? loss * scale : loss);
      mine.allocated.end(StepPhase::Backward);
      mine.loss_sum += loss.item<double>();
      mine.tokens += b.tokens;
      mine.samples += b.samples;
    }
    CollectivePhase phase("step");  // the engine names forward and backward itself
    if (!scaler_ || !unscale_and_check(step, scale)) {
      grad_norm_ = s_.clip_grad_norm > 0 ? engine_->clip_grad_norm(s_.clip_grad_norm) : -1;
      opt_->step(lr_);
    }
    engine_->release_gradients();  // their bytes are free until the next reduction
    mine.allocated.end(StepPhase::Optimizer);
    allocated_run_peak_ = std::max(allocated_run_peak_, mine.allocated.step_peak());
    mine.allocated_run_peak = allocated_run_peak_;
    const CommTotals comm_after = counters_.totals();
    for (size_t k = 0; k < step_comm_.size(); ++k) step_comm_[k] = comm_after[k] - comm_before[k];
    mine.step_peak = proc_memory().hwm;
    run_peak_ = std::max(run_peak_, mine.step_peak);
    mine.rss_rise = measured ? mine.step_peak - before.rss : -1;
    mine.run_peak = run_peak_;
    WorldStep w = gather_step(*groups_->world(), mine);
    if (s_.deterministic) w.loss = ordered_loss;
    max_step_rise_ = std::max(max_step_rise_, w.max_rss_rise);
    if (s_.max_memory_mib > 0 && w.max_allocated_peak > s_.max_memory_mib * (int64_t{1} << 20))
      throw Error("step " + std::to_string(step + 1) + " reached a peak of " + std::to_string(w.max_allocated_peak >> 20) +
                  " MiB allocated on a rank (the plan's measure), over --max-memory-mib " + std::to_string(s_.max_memory_mib) +
                  "; lower --batch-size, or recompute activations (--activation-checkpointing)");
    if (!std::isfinite(w.loss))
      throw Error("the loss is " + std::to_string(w.loss) + " at step " + std::to_string(step + 1) +
                  "; training diverged: lower the optimizer's lr (--optimizer.lr), add --warmup-steps or --clip-grad-norm");
    if (std::isnan(first_loss_)) first_loss_ = w.loss;
    last_loss_ = w.loss;
    ++interval_.steps;
    interval_.tokens += w.tokens;
    interval_.samples += w.samples;
    return w;
  }

  // --deterministic: forward and backward one sample at a time, rank r taking samples j * W + r
  // of each global batch; the engine adds every rank's gradients in that order. The loss of each
  // sample carries 1 / (samples per step), and the step's loss is their sum in global order.
  // Returns it (the same bits on every rank, at every world size).
  double deterministic_passes(RankStep& mine, double scale) {
    const int64_t global = s_.batch_size * world_, per_rank = s_.batch_size;
    const double weight = 1.0 / static_cast<double>(global * s_.grad_accum);
    at::Tensor losses = at::empty({s_.grad_accum * per_rank}, at::kDouble);
    double* l = losses.data_ptr<double>();
    engine_->zero_grad();
    engine_->set_requires_gradient_sync(true);  // every sample's gradients are added at once
    for (int64_t m = 0; m < s_.grad_accum; ++m) {
      Batch b = data_->next();
      if (b.samples != global)
        throw Error("--deterministic: data '" + plan_.data + "' gave " + std::to_string(b.samples) +
                    " samples for a global batch of " + std::to_string(global));
      for (int64_t j = 0; j < per_rank; ++j) {
        const int64_t i = j * world_ + rank_;
        Batch one{b.inputs.narrow(0, i, 1), b.targets.narrow(0, i, 1), 1, b.tokens / b.samples};
        at::Tensor loss = engine_->forward([&] { return model_->loss(one) * weight; });
        mine.allocated.end(StepPhase::Forward);
        engine_->backward(scaler_ ? loss * scale : loss);
        mine.allocated.end(StepPhase::Backward);
        l[m * per_rank + j] = loss.item<double>();  // the step's loss is their ordered sum, below
        mine.tokens += one.tokens;
        mine.samples += 1;
      }
    }
    at::Tensor all = at::empty({world_ * losses.numel()}, at::kDouble);
    world().all_gather(all, losses).wait();
    const double* a = all.data_ptr<double>();
    double sum = 0;  // global sample (m, j, r) is rank r's entry m * per_rank + j
    for (int64_t m = 0; m < s_.grad_accum; ++m)
      for (int64_t j = 0; j < per_rank; ++j)
        for (int r = 0; r < world_; ++r) sum += a[r * losses.numel() + m * per_rank + j];
    return sum;
  }

  // The progress line or bar; at log steps also metrics.jsonl, and a new interval.
  void log(int64_t done, const WorldStep& w) {
    const bool log_now = done % s_.log_every == 0 || done == s_.steps;
    const double elapsed = seconds_since(interval_.start);
    const bool tokens_matter = plan_.tokens_per_step != plan_.samples_per_step;
    Progress p;
    p.step = done;
    p.loss = w.loss;
    p.lr = lr_;
    p.step_time = elapsed / static_cast<double>(interval_.steps);
    p.per_s = static_cast<double>(tokens_matter ? interval_.tokens : interval_.samples) / std::max(elapsed, 1e-9);
    p.unit = tokens_matter ? "tok" : "samples";
    p.eta = seconds_since(train_start_) / static_cast<double>(done - start_step_) * static_cast<double>(s_.steps - done);
    if (!log_now) {
      if (!writer()) return;
      p.peak_mem = allocated_run_peak_;
      out_->update(p, false);
      return;
    }
    on_rank_zero(world(), [&] {
      p.peak_mem = *std::max_element(w.allocated_run_peaks.begin(), w.allocated_run_peaks.end());
      run_dir_.append_metrics(metrics_line(done, w, elapsed, p.step_time).dump());
      out_->update(p, true);
    });
    interval_ = Interval{};
    interval_.comm_start = counters_.totals();
  }

  json metrics_line(int64_t done, const WorldStep& w, double elapsed, double step_time) const {
    const CommTotals now = counters_.totals();
    const auto& c0 = interval_.comm_start;
    const double secs = std::max(elapsed, 1e-9);
    json m{{"step", done},
           {"loss", w.loss},
           {"lr", lr_},
           {"tokens_per_s", static_cast<double>(interval_.tokens) / secs},
           {"samples_per_s", static_cast<double>(interval_.samples) / secs},
           {"step_time_s", step_time},
           {"peak_memory_bytes", w.allocated_run_peaks},
           {"memory_kind", "allocated"},
           {"step_peak_allocated_bytes", w.max_allocated_peak},
           {"phase_peak_allocated_bytes", phase_peaks(w)},
           {"peak_rss_bytes", w.run_peaks},
           {"step_rss_rise_bytes", w.max_rss_rise},
           {"allgather_bytes", (now[0] - c0[0]) / interval_.steps},
           {"reduce_scatter_bytes", (now[1] - c0[1]) / interval_.steps},
           {"all_reduce_bytes", (now[2] - c0[2]) / interval_.steps},
           {"all_to_all_bytes", (now[4] - c0[4]) / interval_.steps},
           {"sent_bytes", (now[3] - c0[3]) / interval_.steps}};
    if (plan_.flops_per_token > 0) {
      const double tflops = plan_.flops_per_token * static_cast<double>(interval_.tokens) / secs / 1e12;
      m["tflops"] = tflops;
      m["mfu"] = tflops / (peak_ * world_);
    }
    if (grad_norm_ >= 0) m["grad_norm"] = grad_norm_;
    if (scaler_) {
      m["loss_scale"] = scaler_->scale();  // for the next step
      m["skipped_steps"] = skipped_steps_;
    }
    return m;
  }

  void evaluate(int64_t step) {
    auto* evaluable = dynamic_cast<Evaluable*>(model_.get());
    auto* heldout = dynamic_cast<HeldOutData*>(data_.get());
    last_eval_ = s_.deterministic ? evaluate_heldout_in_order(*engine_, evaluable, heldout, world(), step)
                                  : evaluate_heldout(*engine_, evaluable, heldout, world(), s_.batch_size, step);
    if (last_eval_.is_null()) return;
    on_rank_zero(world(), [&] {
      out_->line(eval_line(last_eval_));
      run_dir_.append_metrics(last_eval_.dump());
    });
  }

  // Loss scaling: divides every gradient shard of this rank by the scale and looks for inf/NaN;
  // one small all-gather tells every rank which ranks found one. Then every rank skips the step
  // alike, and the scaler learns the outcome. Returns whether the step is skipped.
  bool unscale_and_check(int64_t step, double scale) {
    at::NoGradGuard no_grad;
    inject_inf_fault(step);
    bool bad = false;
    for (auto& p : shards_) {
      at::Tensor g = p.param.grad();
      if (!g.defined()) continue;
      g.mul_(1.0 / scale);
      bad = bad || !at::isfinite(g).all().item<bool>();
    }
    at::Tensor all = at::empty({world_}, at::kFloat);
    world().all_gather(all, at::full({1}, bad ? 1.0 : 0.0, at::kFloat)).wait();
    std::vector<int> found;
    for (int r = 0; r < world_; ++r)
      if (all[r].item<float>() > 0) found.push_back(r);
    scaler_->update(!found.empty());
    if (found.empty()) return false;
    ++skipped_steps_;
    if (writer()) {
      std::string ranks;
      for (int r : found) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      char l[200];
      std::snprintf(l, sizeof l, "step %ld: inf/NaN in the gradients of rank(s) %s: skipped on every rank; loss scale %g -> %g",
                    static_cast<long>(step + 1), ranks.c_str(), scale, scaler_->scale());
      out_->line(l);
    }
    return true;
  }

  // FSDPX_FAULT=inf-grad:R:STEP (fsdpx/framework/base/fault_injection.h): rank R finds an inf in
  // its first gradient shard at step STEP (from 1).
  void inject_inf_fault(int64_t step) const {
    if (shards_.empty() || !shards_.front().param.grad().defined()) return;
    if (!fault_requested("inf-grad", rank_, std::to_string(step + 1))) return;
    shards_.front().param.grad().view(-1)[0].fill_(std::numeric_limits<double>::infinity());
  }

  void save(int64_t step) {
    CollectivePhase phase("checkpoint");
    const std::string dir = (fs::path(run_dir_.checkpoints()) / checkpoint_dir_name(step)).string();
    CheckpointState st = checkpoint_state(*engine_, *opt_, /*for_load=*/false);
    st.step = step;
    json state{{"data", json::parse(data_->state())}, {"seed", s_.seed}, {"step", step}};
    if (auto* hf = dynamic_cast<HuggingFaceModel*>(model_.get())) state["hf_config"] = json::parse(hf->hf_config_json());
    if (scaler_) state["loss_scaler"] = {{"state", json::parse(scaler_->state())}, {"skipped_steps", skipped_steps_}};
    st.trainer_state_json = state.dump();
    st.config_ini = s_.to_ini() + "\n" + config_.to_ini();
    const auto t0 = Clock::now();
    ckpt_->save(dir, st, checkpoint_context(*groups_, *engine_));
    on_rank_zero(world(), [&] {  // the others wait: the checkpoint is complete and pruned when they go on
      char l[300];
      std::snprintf(l, sizeof l, "checkpoint at step %ld: %s (%.2f s)", static_cast<long>(step), dir.c_str(), seconds_since(t0));
      out_->line(l);
      if (s_.keep_last > 0) prune_checkpoints(run_dir_.checkpoints(), s_.keep_last);
    });
    last_checkpoint_ = dir;
  }

  // What was measured, next to what was planned: summary.json and the closing lines.
  void finish() {
    const json ranks = measured_per_rank();
    on_rank_zero(world(), [&] {
      const double wall = seconds_since(wall_start_);
      json summary{{"steps", s_.steps},
                   {"start_step", start_step_},
                   {"first_loss", first_loss_},
                   {"final_loss", last_loss_},
                   {"world_size", world_},
                   {"ranks", ranks},
                   {"last_step_comm",
                    {{"allgather_bytes", step_comm_[0]}, {"reduce_scatter_bytes", step_comm_[1]},
                     {"all_reduce_bytes", step_comm_[2]}, {"all_to_all_bytes", step_comm_[4]},
                     {"sent_bytes", step_comm_[3]}}},
                   {"plan", plan_json(plan_)},
                   {"peak_tflops_per_rank", peak_},
                   {"max_step_rss_rise_bytes", max_step_rise_},
                   {"step_time_s", seconds_since(train_start_) / static_cast<double>(std::max<int64_t>(1, s_.steps - start_step_))},
                   {"wall_s", wall}};
      if (!last_eval_.is_null()) summary["eval"] = last_eval_;
      if (!last_checkpoint_.empty()) summary["checkpoint"] = last_checkpoint_;
      run_dir_.write_summary(summary.dump(2));
      closing_lines(wall);
    });
  }

  // Every rank's persistent bytes (parameters, gradients, optimizer state) and peak RSS.
  json measured_per_rank() {
    MemoryReport mem = engine_->memory();
    int64_t optimizer_bytes = 0;
    for (const auto& p : shards_)
      if (p.param.requires_grad())
        for (const auto& [key, t] : opt_->state(p.name))
          if (t.dim() > 0) optimizer_bytes += t.numel() * t.element_size();
    constexpr int kFields = 5;
    at::Tensor mine = at::full({kFields}, 0, at::kLong);
    mine[0] = mem.param_bytes;
    mine[1] = mem.grad_bytes;
    mine[2] = optimizer_bytes;
    mine[3] = std::max(run_peak_, proc_memory().hwm);
    mine[4] = allocated_run_peak_;
    at::Tensor all = at::empty({kFields * world_}, at::kLong);
    groups_->world()->all_gather(all, mine).wait();
    json ranks = json::array();
    for (int r = 0; r < world_; ++r)
      ranks.push_back({{"param_bytes", all[kFields * r].item<int64_t>()},
                       {"grad_bytes", all[kFields * r + 1].item<int64_t>()},
                       {"optimizer_bytes", all[kFields * r + 2].item<int64_t>()},
                       {"peak_rss_bytes", all[kFields * r + 3].item<int64_t>()},
                       {"peak_allocated_bytes", all[kFields * r + 4].item<int64_t>()}});
    return ranks;
  }

  void closing_lines(double wall) {
    char l[200];
    std::snprintf(l, sizeof l, "done: %ld steps in %.1f s, loss %.4f -> %.4f", static_cast<long>(s_.steps - start_step_), wall,
                  first_loss_, last_loss_);
    out_->line(l);
    if (run_dir_.dir().empty()) return;
    out_->line("metrics:    " + run_dir_.path("metrics.jsonl"));
    out_->line("config:     " + run_dir_.path("config.ini"));
    out_->line("plot:       scripts/fsdpx-plot " + run_dir_.dir() + "  (writes " + run_dir_.path("plot.png") + ")");
    if (!last_checkpoint_.empty()) out_->line("checkpoint: " + last_checkpoint_);
  }

  const PluginHost& host_;
  const RunConfig& config_;
  const TrainSettings& s_;
  const RuntimeOptions& ro_;
  const int rank_, world_;
  const Clock::time_point wall_start_ = Clock::now();
  RunPlan plan_;
  std::shared_ptr<ProcessGroups> groups_;
  std::shared_ptr<Model> model_;
  std::shared_ptr<DataSource> data_;
  std::shared_ptr<Optimizer> opt_;
  std::shared_ptr<CheckpointBackend> ckpt_;
  std::unique_ptr<LossScaler> scaler_;  // when the precision policy scales the loss
  int64_t skipped_steps_ = 0;
  CommCounters counters_;
  std::unique_ptr<ShardingEngine> engine_;
  std::vector<ParamShard> shards_;
  LrSchedule schedule_;
  RunDirectory run_dir_;
  std::unique_ptr<Reporter> out_;
  int64_t start_step_ = 0;
  double peak_ = 0;
  std::string peak_source_ = "--peak-tflops";
  // The loop's running figures.
  Clock::time_point train_start_;
  Interval interval_;
  double lr_ = 0, grad_norm_ = -1;
  double first_loss_ = std::nan(""), last_loss_ = std::nan("");
  int64_t run_peak_ = 0, max_step_rise_ = 0;
  int64_t allocated_run_peak_ = 0;  // the allocated peak of this rank so far (memory_accounting.h)
  CommTotals step_comm_{};
  json last_eval_;
  std::string last_checkpoint_;
};

}  // namespace

int train(const PluginHost& host, const RunConfig& config, const TrainSettings& settings, const RuntimeOptions& runtime) {
  return Trainer(host, config, settings, runtime).run();
}

}  // namespace fsdpx
