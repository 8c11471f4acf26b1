// The Trainer: the training loop as a list of named stages, each concern handed to an object with
// one job (as torchtitan's train.py does): the Checkpointer, the Evaluator, the
// LossScalingGuard and the MetricsProcessor. Plan, build, then per step forward and backward,
// the optimizer step; log, evaluate, save; and the summary at the end.
#include "fsdpx/framework/trainer/trainer.h"

#include <chrono>
#include <functional>
#include <memory>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/ops/stack.h>

#include "checkpointer.h"
#include "components.h"
#include "engine_comms.h"
#include "unit_selection.h"
#include "evaluator.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/runtime/collective_context.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/every_rank.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "fsdpx/framework/trainer/lr_schedule.h"
#include "fsdpx/framework/trainer/run_directory.h"
#include "loss_scaling_guard.h"
#include "metrics_processor.h"
#include "plan_json.h"
#include "rank_zero.h"
#include "step_profiler.h"
#include "reporter.h"

namespace fsdpx {

std::map<Kind, std::string> default_components() {
  return {{Kind::Model, "gpt"},       {Kind::Data, "text"},      {Kind::Sharding, "full_shard"},
          {Kind::Wrap, "layer_type"}, {Kind::Precision, "fp32"}, {Kind::Optimizer, "adamw"}};
}

namespace {

class Trainer {
 public:
  Trainer(const PluginHost& host, const RunConfig& config, const TrainSettings& s, const RuntimeOptions& ro)
      : host_(host), config_(config), s_(s), ro_(ro), rank_(ro.topology.rank), world_(ro.topology.world_size),
        run_dir_(s.out_dir, rank_ == 0), out_(rank_ == 0 && s.progress_bar, s.steps) {}

  int run() {
    plan();
    connect();
    check_memory();
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
    checkpointer_->initial_weights();
    const int64_t start_step = checkpointer_->restore();
    metrics_->open(start_step);
    metrics_->measure_peak_flops();
    metrics_->announce();
    metrics_->start();
    for (int64_t step = start_step; step < s_.steps; ++step) {
      const bool profiled = rank_ == 0 && s_.profile_step == step + 1;
      if (profiled) profiler_.start(device_->device().is_cuda());
      const WorldStep w = train_step(step);
      if (profiled) report_profile(step + 1);
      const int64_t done = step + 1;
      metrics_->log(done, w, lr_, grad_norm_, *scaling_);
      if (s_.eval_every > 0 && done % s_.eval_every == 0 && done != s_.steps) evaluate(done);
      checkpointer_->poll();  // a background save that finished: reported, or its failure thrown
      if (s_.save_every > 0 && done % s_.save_every == 0 && done != s_.steps) checkpointer_->save(done);
    }
    evaluate(s_.steps);
    checkpointer_->save(s_.steps);
    checkpointer_->finish();
    metrics_->finish(persistent_bytes(*engine_, *opt_, shards_), checkpointer_->last_saved());
  }

  // Rank 0's profile of step `step`: profile.json, and a line naming the three that took most.
  void report_profile(int64_t step) {
    if (device_->device().type() != c10::kCPU) device_->synchronize();  // the kernels of the step
    nlohmann::json p = profiler_.stop(20);
    p["step"] = step;
    p["device"] = device_->name();
    out_.line(StepProfiler::summary_line(p, step) +
              (run_dir_.active() ? "; all in " + run_dir_.path("profile.json") : ""));
    run_dir_.write_profile(p.dump(1));
  }

  // Losses, counts, flags and checkpoint sums go over the control group (Gloo, CPU tensors): the
  // device group (NCCL on CUDA) carries the engine's collectives only.
  Communicator& control() const { return *groups_->control(); }

  // The checks that need no process group, and the plan (the same as --dry-run's).
  void plan() {
    check_device_trains(ro_.device, ro_.backend, ro_.topology.local_world_size, ro_.share_devices);
    if (s_.deterministic && at::get_cpu_capability() != "DEFAULT")
      throw Error("--deterministic needs ATen's unvectorised CPU kernels, and this process already chose " +
                  at::get_cpu_capability() + " ones: set ATEN_CPU_CAPABILITY=default before the first tensor operation "
                  "(fsdpx-train does so itself)");
    plan_ = plan_run(host_, config_, s_, ro_.topology, &made_);
    if (s_.max_memory_mib > 0 && !cpu_memory_accounting_installed())
      throw Error("--max-memory-mib checks the bytes LibTorch allocates, counted from the process's start "
                  "(install_cpu_memory_accounting(), which fsdpx-train calls first); this process did not install it");
    check_optimizer_runs_here(plan_);
    at::set_num_threads(plan_.threads.threads);
  }

  // The device, and the process groups (the rendezvous): every rank of the job runs after it.
  void connect() {
    device_ = open_device(device_spec(ro_.device), ro_.topology.local_rank);
    groups_ = ProcessGroups::create(ro_);
    if (rank_ == 0 && !groups_->nccl_pose().empty())
      out_.line("ranks share devices (--share-gpus): " + std::to_string(ro_.topology.local_world_size) +
                " local ranks on " + std::to_string(visible_device_count(device_spec(ro_.device))) + " " +
                device_spec(ro_.device) + " device(s), each a node of its own to NCCL (rank 0: " +
                groups_->nccl_pose() + "); the bytes go over sockets, so the speed is not a cluster's");
  }

  // Before anything is allocated: the plan against this rank's device and, unless its launcher
  // checked them, the node's host memory. Every rank ends with the same line when any rank's
  // does not fit (no rank is left waiting in a collective).
  void check_memory() {
    std::string refusal;
    if (s_.check_memory) {
      const MemoryFit fit = memory_fit_in_rank(plan_, *device_, ro_.topology, !s_.host_memory_checked);
      if (!fit.fits()) refusal = fit.refusal(plan_);
    }
    refuse_together(control(), refusal);
  }

  // Components, the engine over counted communicators, the optimizer, the data, and the objects
  // the stages hand their concerns to.
  void build() {
    metrics_ = std::make_unique<MetricsProcessor>(s_, plan_, run_dir_, out_, control(), *device_, wall_start_);
    // What the plan made (once per process); the data source is the run's own (DataSource::open).
    model_ = made_.model;
    data_ = make<DataSource>(host_, config_);
    opt_ = made_.optimizer;
    const auto precision = made_.precision;
    build_scaling(*precision);
    EngineOptions eo;
    eo.layout = plan_.layout;
    eo.precision = plan_.dtypes;
    use_precision_policy(eo, precision);
    eo.seed = s_.seed;
    eo.overlap = s_.overlap;
    eo.deterministic = s_.deterministic;
    eo.device = device_;
    clock_ = std::make_shared<StepClock>(device_);
    eo.clock = clock_;
    if (s_.optimizer_in_backward)  // plan_run checked that the optimizer can (Optimizer::step_shards)
      eo.step_in_backward = [this](size_t first, size_t count) { opt_->step_shards(lr_, first, count); };
    engine_ = build_engine(model_, *made_.wrap, s_.layer_type_choices(), *groups_, eo, metrics_->counters());
    shards_ = engine_->shards();
    opt_->init(shards_);
    // Deterministic: every rank reads the whole global batch (as one rank would) and computes
    // the samples j * W + rank of it, so that its position is the same at every world size.
    if (s_.deterministic) data_->open(DataContext{0, 1, s_.batch_size * world_, s_.seed});
    else data_->open(DataContext{rank_, world_, s_.batch_size, s_.seed});
    schedule_ = LrSchedule::parse(s_.lr_schedule, opt_->base_lr(), s_.warmup_steps, s_.steps, s_.min_lr_ratio);
    evaluator_ = std::make_unique<Evaluator>(*engine_, *model_, *data_, control(), device_->device(), s_.batch_size,
                                             s_.deterministic);
    checkpointer_ = std::make_unique<Checkpointer>(
        made_.checkpoint, s_, config_ini(), *groups_, run_dir_, out_,
        CheckpointParts{*engine_, *model_, *opt_, *data_, *scaling_, *metrics_, device_});
  }

  // A precision policy that needs loss scaling owns the scaler (fsdpx/loss_scaling.h).
  void build_scaling(const PrecisionPolicy& precision) {
    std::unique_ptr<LossScaler> scaler;
    if (auto* scaling = dynamic_cast<const LossScalingPolicy*>(&precision)) scaler = scaling->make_scaler();
    if (plan_.dtypes.loss_scaling && !scaler)
      throw Error("precision '" + plan_.precision +
                  "' asks for loss scaling but offers no scaler (fsdpx/loss_scaling.h)");
    scaling_ = std::make_unique<LossScalingGuard>(std::move(scaler), control(), [this](const std::string& line) {
      out_.line(line);
    });
  }

  // What the run read, and what it read without applying it (RunPlan::not_applied).
  std::string config_ini() const {
    std::string notes;
    for (const auto& what : plan_.not_applied) notes += "# not applied: " + what + "\n";
    return s_.to_ini() + "\n" + config_.used_ini() + notes;
  }

  void open_run_directory() {
    on_rank_zero(control(), [&] { run_dir_.create(config_ini(), world_, plan_json(plan_).dump(2)); });
  }

  // One optimizer step: forward and backward per micro-batch, then the optimizer; the figures
  // every rank agrees on.
  WorldStep train_step(int64_t step) {
    lr_ = schedule_.at(step);
    RankStep mine = metrics_->begin_step();
    double ordered_loss = 0.0;
    {
      TimedSpan whole(clock_.get(), TimedPhase::Step);
      scaling_->begin_step();
      if (s_.optimizer_in_backward) checkpointer_->settle();  // the backward steps the optimizer
      ordered_loss = s_.deterministic ? deterministic_passes(mine) : 0.0;
      if (!s_.deterministic) forward_backward(mine);
      CollectivePhase phase("step");  // the engine names forward and backward itself
      optimizer_step(step);
      if (loss_sum_.defined()) unread_losses_.push_back(loss_sum_);
      loss_sum_ = at::Tensor();
      if (metrics_->logs_at(step + 1) && !unread_losses_.empty()) {
        // The host's one wait for the device in a log interval: every step's loss since the last.
        const at::Tensor host = at::stack(unread_losses_).to(at::kCPU);
        mine.losses.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
        unread_losses_.clear();
      }
    }
    clock_->step_done();
    if (metrics_->logs_at(step + 1)) mine.breakdown = clock_->take();  // the device's marks are done by now
    trim_cpu_block_cache();  // the host blocks this step no longer used go back to the system
    return metrics_->end_step(step, mine, ordered_loss);
  }

  // One forward (of `loss`, the model's loss as the step weighs it) and its backward, timed, with
  // the allocated peak of each. Returns the loss.
  at::Tensor pass(const std::function<at::Tensor()>& loss, RankStep& mine) {
    at::Tensor l;
    {
      TimedSpan forward(clock_.get(), TimedPhase::Forward);
      l = engine_->forward(loss);
    }
    mine.allocated.end(StepPhase::Forward);
    {
      TimedSpan backward(clock_.get(), TimedPhase::Backward);
      engine_->backward(scaling_->scaled(l));
    }
    mine.allocated.end(StepPhase::Backward);
    return l;
  }

  // Forward and backward of each micro-batch; the last one reduces the gradients.
  void forward_backward(RankStep& mine) {
    for (int64_t m = 0; m < s_.grad_accum; ++m) {
      engine_->set_requires_gradient_sync(m == s_.grad_accum - 1);
      Batch b = on_device(data_->next(), device_->device());
      const at::Tensor loss = pass([&] { return model_->loss(b) / static_cast<double>(s_.grad_accum); }, mine);
      // Added on the device, in fp64 as the host added it; read at the next log step.
      const at::Tensor l = loss.detach().to(at::kDouble);
      loss_sum_ = loss_sum_.defined() ? loss_sum_ + l : l;
      mine.tokens += b.tokens;
      mine.samples += b.samples;
    }
  }

  // --deterministic: forward and backward one sample at a time, rank r taking samples j * W + r
  // of each global batch; the engine adds every rank's gradients in that order. The loss of each
  // sample carries 1 / (samples per step), and the step's loss is their sum in global order.
  // Returns it (the same bits on every rank, at every world size).
  double deterministic_passes(RankStep& mine) {
    const int64_t global = s_.batch_size * world_, per_rank = s_.batch_size;
    const double weight = 1.0 / static_cast<double>(global * s_.grad_accum);
    std::vector<double> losses;
    engine_->zero_grad();
    engine_->set_requires_gradient_sync(true);  // every sample's gradients are added at once
    for (int64_t m = 0; m < s_.grad_accum; ++m) {
      Batch b = data_->next();
      if (b.samples != global)
        throw Error("--deterministic: data '" + plan_.data + "' gave " + std::to_string(b.samples) +
                    " samples for a global batch of " + std::to_string(global));
      for (int64_t j = 0; j < per_rank; ++j) {
        const int64_t i = j * world_ + rank_;
        Batch one = on_device(Batch{b.inputs.narrow(0, i, 1), b.targets.narrow(0, i, 1), 1, b.tokens / b.samples},
                              device_->device());
        const at::Tensor loss = pass([&] { return model_->loss(one) * weight; }, mine);
        losses.push_back(loss.item<double>());  // the step's loss is their ordered sum, below
        mine.tokens += one.tokens;
        mine.samples += 1;
      }
    }
    const auto all = from_every_rank(control(), losses);
    double sum = 0;  // global sample (m, j, r) is rank r's entry m * per_rank + j
    for (int64_t m = 0; m < s_.grad_accum; ++m)
      for (int64_t j = 0; j < per_rank; ++j)
        for (int r = 0; r < world_; ++r) sum += all[static_cast<size_t>(r)][static_cast<size_t>(m * per_rank + j)];
    return sum;
  }

  // Unscale and check (a step with inf/NaN is skipped on every rank), clip, the optimizer; then
  // the gradient shards' bytes are free until the next reduction. --optimizer-in-backward: the
  // backward has stepped every unit (no loss scaling, no clipping: refused with it).
  void optimizer_step(int64_t step) {
    checkpointer_->settle();  // a save's staging reads the state the optimizer writes
    TimedSpan optimizer(clock_.get(), TimedPhase::Optimizer);
    if (!s_.optimizer_in_backward && !scaling_->unscale_and_check(shards_, step)) {
      grad_norm_ = s_.clip_grad_norm > 0 ? engine_->clip_grad_norm(s_.clip_grad_norm) : -1;
      opt_->step(lr_);
    }
    engine_->release_gradients();
  }

  void evaluate(int64_t step) {
    const nlohmann::json record = evaluator_->evaluate(step);
    if (!record.is_null()) metrics_->log_eval(record);
  }

  const PluginHost& host_;
  const RunConfig& config_;
  const TrainSettings& s_;
  const RuntimeOptions& ro_;
  const int rank_, world_;
  const MetricsProcessor::Clock::time_point wall_start_ = MetricsProcessor::Clock::now();
  RunDirectory run_dir_;
  Reporter out_;
  RunPlan plan_;
  PlannedComponents made_;  // by plan(), used by build()
  std::shared_ptr<DeviceRuntime> device_;  // where the engine computes
  std::shared_ptr<ProcessGroups> groups_;
  std::shared_ptr<Model> model_;
  std::shared_ptr<DataSource> data_;
  std::shared_ptr<Optimizer> opt_;
  std::unique_ptr<MetricsProcessor> metrics_;
  std::unique_ptr<LossScalingGuard> scaling_;
  std::unique_ptr<ShardingEngine> engine_;
  std::shared_ptr<StepClock> clock_;  // where each step's time goes (the engine marks its waits on it)
  StepProfiler profiler_;              // --profile-step
  std::vector<ParamShard> shards_;
  LrSchedule schedule_;
  std::unique_ptr<Evaluator> evaluator_;
  std::unique_ptr<Checkpointer> checkpointer_;
  double lr_ = 0, grad_norm_ = -1;
  at::Tensor loss_sum_;  // the step's loss so far, on the device
  std::vector<at::Tensor> unread_losses_;  // each step's since the last log step, on the device
};

}  // namespace

int train(const PluginHost& host, const RunConfig& config, const TrainSettings& settings,
          const RuntimeOptions& runtime) {
  return Trainer(host, config, settings, runtime).run();
}

}  // namespace fsdpx
