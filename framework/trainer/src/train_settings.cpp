#include "fsdpx/framework/trainer/train_settings.h"

#include <filesystem>
#include <sstream>

#include <boost/program_options.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/plugin_host/host_options.h"
#include "fsdpx/framework/trainer/lr_schedule.h"
#include "fsdpx/framework/trainer/train_command.h"  // device_of
#include "run_paths.h"

namespace po = boost::program_options;

namespace fsdpx {

namespace {

// "a,b,,c" -> {a, b, c}, and back.
std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ','))
    if (!item.empty()) items.push_back(item);
  return items;
}
std::string join_list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

// --save-init replaces DIR as a whole (written aside, then renamed): refuse a DIR that holds
// anything else, the run directory included.
void check_save_init(const std::string& save_init, const std::string& out_dir) {
  namespace fs = std::filesystem;
  if (save_init.empty()) return;
  const fs::path dir = fs::absolute(save_init).lexically_normal();
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw Error("--save-init " + save_init +
                " is a file; give a directory (it receives model.safetensors and digests.json)");
  if (fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name != "model.safetensors" && name != "digests.json")
        throw Error("--save-init " + save_init + " holds '" + name +
                    "', and the save replaces the whole directory; give a new "
                    "or empty directory");
    }
  if (out_dir.empty()) return;
  const std::string out = fs::absolute(out_dir).lexically_normal().string() + "/", d = dir.string() + "/";
  if (out.rfind(d, 0) == 0)
    throw Error("--out " + out_dir + " is inside --save-init " + save_init +
                ", which the save replaces as a whole; put them side by side");
}

// What needs every gradient shard before any is stepped cannot run with the step inside backward.
void check_optimizer_in_backward(const TrainSettings& s) {
  if (!s.optimizer_in_backward) return;
  if (s.clip_grad_norm > 0)
    throw Error("--optimizer-in-backward steps each unit as soon as its gradients are reduced, and "
                "--clip-grad-norm needs the norm of every gradient before any step; drop one of them");
  if (s.deterministic)
    throw Error("--optimizer-in-backward steps each unit as soon as its gradients are reduced, and --deterministic "
                "adds every sample's gradients into the shards one backward at a time before the step; drop one of "
                "them");
}

}  // namespace

po::options_description TrainSettings::options() {
  po::options_description d("Training (fsdpx-train's own options; also top-level keys of --config)");
  d.add_options()("steps", int_value<int64_t>({1})->default_value(100),
                  "optimizer steps to train (a resumed run counts from its checkpoint)")(
      "batch-size", int_value<int64_t>({1, 1 << 24})->default_value(8), "samples per rank per micro-batch")(
      "grad-accum", int_value<int64_t>({1, 1 << 20})->default_value(1), "micro-batches per optimizer step")(
      "seed", int_value<int64_t>({0})->default_value(0), "seed of the parameters and the data order")(
      "out", po::value<std::string>()->default_value(""),
      "run directory: metrics.jsonl, config.ini, summary.json, checkpoints")(
      "log-every", int_value<int64_t>({1})->default_value(10), "steps between metric lines")(
      "lr-schedule", po::value<std::string>()->default_value("constant"),
      "constant or cosine (the optimizer's lr is the peak)")("warmup-steps", int_value<int64_t>({0})->default_value(0),
                                                             "linear warm-up steps")(
      "min-lr-ratio", float_value(FloatRange::closed(0, 1))->default_value(0.1, "0.1"),
      "cosine floor as a fraction of the peak lr")(
      "clip-grad-norm", float_value(FloatRange::at_least(0))->default_value(0.0),
      "clip the global gradient norm to this (0: off)")("eval-every", int_value<int64_t>({0})->default_value(0),
                                                        "held-out evaluation every N steps (0: at the end only)")(
      "peak-tflops", float_value(FloatRange::at_least(0))->default_value(0.0),
      "per-rank peak for MFU (0: measured by a short matmul probe in the compute dtype)")(
      "overlap", int_value<int>({0, 1})->default_value(1),
      "1: gather the next unit while this one computes; 0: no overlap")(
      "deterministic", po::bool_switch(),
      "bitwise-identical losses and weights at every world size and strategy for a "
      "given seed and global batch: one sample per forward, one thread per rank, gradients summed in global-sample "
      "order "
      "(slower; --dry-run shows the cost in bytes)")(
      "optimizer-in-backward", po::bool_switch(),
      "update each unit's shards as soon as its gradients are reduced, inside backward, and free its gradient "
      "shard at once: no rank ever holds every gradient shard (the same bits as the step after backward; not with "
      "--clip-grad-norm, --deterministic or fp16's loss scaling, which need every gradient first)")(
      "activation-checkpointing", po::value<std::string>()->default_value(""),
      "layer types (comma-separated) whose units recompute their activations in backward, e.g. Block")(
      "activation-offload", po::value<std::string>()->default_value(""),
      "layer types (comma-separated) among --activation-checkpointing's whose units' main input (the hidden state "
      "a recomputed unit keeps) goes to host memory in forward and comes back one unit ahead of its backward "
      "(devices; on the CPU there is nothing to move)")(
      "max-memory-mib", int_value<int64_t>({0, int64_t{1} << 30})->default_value(0),
      "stop with an error when a rank's allocated peak in a step (the plan's measure) exceeds this many MiB (0: no "
      "limit)")("profile-step", int_value<int64_t>({0})->default_value(0),
                "rank 0 profiles step N with LibTorch's profiler (Kineto): the kernels (GPU) or operators (CPU) "
                "that took most time, in OUT/profile.json and one line (0: none)")(
      "save-every", int_value<int64_t>({0})->default_value(0),
      "checkpoint every N steps (0: at the end only); needs [checkpoint]")(
      "keep-last", int_value<int64_t>({0})->default_value(0), "keep the newest K checkpoints (0: all)")(
      "resume", po::value<std::string>()->default_value(""),
      "auto (newest complete checkpoint under OUT/checkpoints) or a checkpoint directory")(
      "init-from", po::value<std::string>()->default_value(""),
      "initial weights from a safetensors file of whole tensors under the model's names, or a directory holding "
      "model.safetensors (a consolidated checkpoint, or --save-init's)")(
      "save-init", po::value<std::string>()->default_value(""),
      "write the initial weights, whole, to DIR/model.safetensors (with digests.json) before the first step")(
      "cluster", po::value<std::string>()->default_value(""),
      "predict the step's time (--dry-run, plan.json) on the accelerators this JSON file describes, e.g. "
      "configs/clusters/h100.json (default: this machine's CPU, probed; a GPU run without it is not predicted)");
  return d;
}

TrainSettings TrainSettings::from(const HostValues& vm) {
  TrainSettings s;
  s.steps = vm["steps"].as<int64_t>();
  s.batch_size = vm["batch-size"].as<int64_t>();
  s.check_memory = vm.count("skip-memory-check") == 0;
  s.grad_accum = vm["grad-accum"].as<int64_t>();
  const int64_t seed = vm["seed"].as<int64_t>();
  s.out_dir = vm["out"].as<std::string>();
  if (vm.count("device")) s.device = device_of(vm);
  s.log_every = vm["log-every"].as<int64_t>();
  s.lr_schedule = vm["lr-schedule"].as<std::string>();
  s.warmup_steps = vm["warmup-steps"].as<int64_t>();
  // The floor is the cosine schedule's: read only there, and refused where given for another one
  // (it was accepted and did nothing, while config.ini recorded it).
  if (s.lr_schedule == "cosine") {
    s.min_lr_ratio = vm["min-lr-ratio"].as<double>();
  } else {
    vm.mark_read("min-lr-ratio");  // looked at: given for another schedule, it is refused
    if (!vm.unmarked()["min-lr-ratio"].defaulted()) {
      std::ostringstream given;
      given << vm["min-lr-ratio"].as<double>();
      throw Error("--min-lr-ratio " + given.str() + " is the cosine schedule's floor, and --lr-schedule is " +
                  s.lr_schedule + ", whose lr never decays; drop --min-lr-ratio, or add --lr-schedule cosine");
    }
  }
  s.clip_grad_norm = vm["clip-grad-norm"].as<double>();
  s.eval_every = vm["eval-every"].as<int64_t>();
  s.peak_tflops = vm["peak-tflops"].as<double>();
  const int overlap = vm["overlap"].as<int>();
  s.save_every = vm["save-every"].as<int64_t>();
  s.keep_last = vm["keep-last"].as<int64_t>();
  s.resume = vm["resume"].as<std::string>();
  s.init_from = vm["init-from"].as<std::string>();
  s.save_init = vm["save-init"].as<std::string>();
  s.cluster = vm["cluster"].as<std::string>();
  s.checkpoint_layer_types = comma_list(vm["activation-checkpointing"].as<std::string>());
  s.offload_layer_types = comma_list(vm["activation-offload"].as<std::string>());
  s.max_memory_mib = vm["max-memory-mib"].as<int64_t>();
  s.profile_step = vm["profile-step"].as<int64_t>();
  if (s.profile_step > s.steps)
    throw Error("--profile-step " + std::to_string(s.profile_step) + " is past the run's last step " +
                std::to_string(s.steps) + ": give a step from 1 to --steps (0: none)");
  // Every number is within the range options() declares for it (host_options.h).
  s.seed = static_cast<uint64_t>(seed);
  s.overlap = overlap == 1;
  s.deterministic = vm["deterministic"].as<bool>();
  s.optimizer_in_backward = vm["optimizer-in-backward"].as<bool>();
  check_optimizer_in_backward(s);
  // The schedule's own checks (kind, warm-up within the run, floor in [0, 1]).
  LrSchedule::parse(s.lr_schedule, 1.0, s.warmup_steps, s.steps, s.min_lr_ratio);
  check_save_init(s.save_init, s.out_dir);
  check_run_paths(s);
  if (s.resume == "auto" && s.out_dir.empty())
    throw Error(
        "--resume auto looks for checkpoints under --out DIR, and no --out was given; give --out or a checkpoint path");
  return s;
}

std::string TrainSettings::to_ini() const {
  std::ostringstream o;
  o << "steps=" << steps << "\nbatch-size=" << batch_size << "\ngrad-accum=" << grad_accum << "\nseed=" << seed
    << "\nlog-every=" << log_every << "\nlr-schedule=" << lr_schedule << "\nwarmup-steps=" << warmup_steps;
  if (lr_schedule == "cosine") o << "\nmin-lr-ratio=" << min_lr_ratio;  // the other schedules have no floor
  o << "\nclip-grad-norm=" << clip_grad_norm << "\neval-every=" << eval_every
    << "\npeak-tflops=" << peak_tflops << "\noverlap=" << (overlap ? 1 : 0) << "\nsave-every=" << save_every
    << "\nkeep-last=" << keep_last << "\nmax-memory-mib=" << max_memory_mib << "\n";
  if (!checkpoint_layer_types.empty()) o << "activation-checkpointing=" << join_list(checkpoint_layer_types) << "\n";
  if (!offload_layer_types.empty()) o << "activation-offload=" << join_list(offload_layer_types) << "\n";
  if (deterministic) o << "deterministic=true\n";
  if (optimizer_in_backward) o << "optimizer-in-backward=true\n";
  if (!out_dir.empty()) o << "out=" << out_dir << "\n";
  if (!init_from.empty()) o << "init-from=" << init_from << "\n";
  if (!cluster.empty()) o << "cluster=" << cluster << "\n";
  return o.str();
}

}  // namespace fsdpx
