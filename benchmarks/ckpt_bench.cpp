// fsdpx-ckpt-bench: save and load throughput of the sharded and consolidated checkpoints, and the
// memory a load adds, for a gpt of at least 500 MB (default: dim 1024, 8 layers, vocabulary
// 32000: 166M parameters, 664 MB in fp32) with adamw state, on N ranks.
//
//   fsdpx-ckpt-bench --nproc-per-node 2 [--dir /tmp/fsdpx-ckpt-bench] [--layers 8] [--dim 1024]
//
// Throughput is bytes written (or read) over all ranks / the slowest rank's wall time. The load's
// memory is the rise of the peak RSS (VmHWM, reset through /proc/self/clear_refs before the load)
// over the RSS before it, next to this rank's shard: a load that read whole tensors would add the
// model's size.
//
// Then the stall: the time a training step waits for a sharded save, synchronous (the whole save)
// and asynchronous (--checkpoint.async: staging into the pool; the writer thread then writes and
// fsyncs), side by side with their ratio, the RSS the asynchronous save adds next to its pool, and
// the floor: the disk's own fsynced write speed, every rank writing plain files of its checkpoint's
// size with write(2) and fsync at once.
//
// With --load DIR it only loads the parameters of that gpt from DIR (a sharded checkpoint, or a
// folder PyTorch's DCP wrote: tests/hf/dcp_load_memory_test.py writes one) and prints the load's
// speed and the RSS it adds next to the largest tensor's rows on a rank.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/checkpoint/synced_files.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/trainer/checkpoint_saver.h"
#include "fsdpx/framework/trainer/checkpoint_state.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/interfaces.h"
#include "tool.h"

namespace fs = std::filesystem;
using namespace fsdpx;
namespace po = boost::program_options;

namespace {

int64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
  return -1;
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

int64_t dir_bytes(const fs::path& p) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(p))
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  return n;
}

// A checkpoint's trainer state at step 1 (the trainer writes the data position it stopped at).
const char* const kTrainerState = R"({"step": 1, "seed": 0, "data": {}})";

// Seconds to write `bytes` to a new file under `dir` with plain write(2)s of 64 MiB and an fsync.
double plain_write_s(const fs::path& dir, int rank, int64_t bytes) {
  fs::create_directories(dir);
  const std::string path = (dir / ("floor-" + std::to_string(rank))).string();
  std::vector<char> block(size_t{64} << 20, 1);
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path + ": cannot be written");
  for (int64_t left = bytes; left > 0; left -= static_cast<int64_t>(block.size()))
    write_all(fd, block.data(), static_cast<size_t>(std::min<int64_t>(left, block.size())), path);
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fs::remove(path);
  if (!synced) throw Error(path + ": fsync failed");
  return s;
}

// The largest of every rank's `v`.
double max_over_ranks(ProcessGroups& groups, double v) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  groups.world()->all_reduce(t, ReduceOp::Max).wait();
  return t.item<double>();
}

// One training step of `model` on a random batch of 2 x 128 tokens: forward, backward, then (after
// `before_optimizer`) the optimizer; the slowest rank's seconds.
double train_step(ProcessGroups& groups, Model& model, ShardingEngine& engine, Optimizer& opt, int64_t vocab,
                  const std::function<void()>& before_optimizer) {
  groups.world()->barrier().wait();
  const auto t0 = std::chrono::steady_clock::now();
  const at::Tensor tokens = at::randint(vocab, {2, 129}, at::kLong);
  const Batch b{tokens.narrow(1, 0, 128), tokens.narrow(1, 1, 128), 2, 256};
  engine.backward(engine.forward([&] { return model.loss(b); }));
  before_optimizer();
  opt.step(1e-6);
  engine.release_gradients();
  return max_over_ranks(groups, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The step after an asynchronous save, staged during it (fsdpx-train on the CPU) and staged inside
// the save, against a step without a save; the writer writes while each runs.
struct StepAfterSave {
  double plain = 0, deferred = 0, inline_staged = 0, inline_stall = 0;
  SaveFigures deferred_save;
};
StepAfterSave step_after_save(ProcessGroups& groups, CheckpointSaver& saver, const std::string& dir,
                              const std::function<CheckpointState()>& state, Model& model, ShardingEngine& engine,
                              Optimizer& opt, int64_t vocab) {
  StepAfterSave s;
  train_step(groups, model, engine, opt, vocab, [] {});  // the first step's allocations, not timed
  s.plain = train_step(groups, model, engine, opt, vocab, [] {});
  groups.world()->barrier().wait();
  saver.save(dir, state(), {}, /*defer_staging=*/true);
  s.deferred = train_step(groups, model, engine, opt, vocab, [&] { saver.settle(); });
  saver.wait();
  s.deferred_save = saver.take_finished().at(0);
  groups.world()->barrier().wait();
  saver.save(dir, state());
  s.inline_staged = train_step(groups, model, engine, opt, vocab, [] {});
  saver.wait();
  s.inline_stall = saver.take_finished().at(0).stall_s;
  return s;
}

// Sync against async stall of a sharded save of `engine`'s and `opt`'s state, and the floor; then
// an async save staged during the next training step (as fsdpx-train does on the CPU): its stall
// and that step's time against a step without a save.
void stall_table(ProcessGroups& groups, PluginHost& host, Model& model, ShardingEngine& engine, Optimizer& opt,
                 const fs::path& root, int64_t pool_mib, int64_t vocab) {
  const int rank = groups.topology().rank;
  const CheckpointContext ctx = checkpoint_context(groups, engine);
  const CheckpointContext bg = checkpoint_context(groups.new_control_group("checkpoint"), engine);
  const std::shared_ptr<const DeviceRuntime> cpu = open_device("cpu", 0);
  // [0] sync, [1] async's first save, [2] its second (into the same pool).
  double stall[3] = {0, 0, 0}, write[3] = {0, 0, 0};
  int64_t rss_rise = 0, pool_bytes = 0, mine = 0;
  const auto state = [&] {
    CheckpointState st = checkpoint_state(engine, opt, /*for_load=*/false);
    st.step = 1;
    st.trainer_state_json = kTrainerState;
    return st;
  };
  const std::string dir = (root / "stall" / "step-00000001").string();
  const auto options = [&](bool async) {
    return std::map<std::string, std::string>{{"async", async ? "true" : "false"},
                                              {"pool_mib", std::to_string(pool_mib)}};
  };
  groups.world()->barrier().wait();
  const auto t0 = std::chrono::steady_clock::now();
  host.create<CheckpointBackend>("sharded", options(false))->save(dir, state(), ctx);
  stall[0] = write[0] = max_over_ranks(groups, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                                                   .count());
  auto b = host.create<CheckpointBackend>("sharded", options(true));
  CheckpointSaver saver(dynamic_cast<StreamedCheckpointBackend&>(*b), ctx, bg, cpu);
  const int64_t rss_before = status_kib("VmRSS:");
  reset_peak_rss();
  const auto r0 = std::chrono::steady_clock::now();
  saver.reserve(state());  // as fsdpx-train does before its first step
  const double reserve_s = max_over_ranks(groups, std::chrono::duration<double>(std::chrono::steady_clock::now() - r0)
                                                      .count());
  for (int k = 1; k <= 2; ++k) {
    groups.world()->barrier().wait();
    saver.save(dir, state());
    saver.wait();
    const SaveFigures f = saver.take_finished().at(0);
    stall[k] = f.stall_s;
    write[k] = max_over_ranks(groups, f.write_s);
    mine = f.staged_bytes;
  }
  rss_rise = static_cast<int64_t>(max_over_ranks(groups, (status_kib("VmHWM:") - rss_before) * 1024.0));
  pool_bytes = saver.pool_allocated();
  const StepAfterSave after = step_after_save(groups, saver, dir, state, model, engine, opt, vocab);
  groups.world()->barrier().wait();
  if (rank == 0) fs::remove_all(root / "stall");
  const double bytes = max_over_ranks(groups, static_cast<double>(mine)) * groups.topology().world_size;
  groups.world()->barrier().wait();
  const double floor_s = max_over_ranks(groups, plain_write_s(root / "floor", rank, mine));
  if (rank != 0) return;
  std::printf("sharded save stall (the step's wait, slowest rank), %.0f MB over %d rank(s):\n", bytes / 1e6,
              groups.topology().world_size);
  std::printf("  sync  %7.3f s (the whole save: %6.0f MB/s)\n", stall[0], bytes / 1e6 / write[0]);
  for (int k = 1; k <= 2; ++k)
    std::printf("  async %7.3f s (%s; written in %.2f s in the background: %6.0f MB/s)\n", stall[k],
                k == 1 ? "first save: staging into the pool" : "second save: the same", write[k],
                bytes / 1e6 / write[k]);
  std::printf("  async / sync = %.3f (first save %.3f)\n", stall[2] / stall[0], stall[1] / stall[0]);
  std::printf("  async, staged during the next step (fsdpx-train on the CPU): stall %.4f s = %.4f of sync (staged "
              "in %.2f s on a thread of its own)\n",
              after.deferred_save.stall_s, after.deferred_save.stall_s / stall[0], after.deferred_save.stage_s);
  std::printf("  the step after a save against one without (%.2f s), while the writer writes: staged during it "
              "%.2f s (%.2fx), staged in the save %.2f s (%.2fx, after a stall of %.3f s); stall + step: %.2f s "
              "against %.2f s\n",
              after.plain, after.deferred, after.deferred / after.plain, after.inline_staged,
              after.inline_staged / after.plain, after.inline_stall, after.deferred_save.stall_s + after.deferred,
              after.inline_stall + after.inline_staged);
  std::printf("  (the pool was allocated and touched once, before the first save, in %.2f s)\n", reserve_s);
  std::printf("  async saves add at most %.0f MB of RSS on a rank; the pool holds %.0f MB (bound %ld MiB)\n",
              rss_rise / 1e6, pool_bytes / 1e6, static_cast<long>(pool_mib));
  std::printf("  floor: plain write(2) + fsync of the same bytes, every rank at once: %.2f s = %.0f MB/s "
              "(the sync save is %.2fx the floor)\n",
              floor_s, bytes / 1e6 / floor_s, write[0] / floor_s);
}

// --load: the parameters from `dir`, timed, with the peak RSS the load adds on the worst rank.
int load_only(ProcessGroups& groups, ShardingEngine& engine, const std::string& dir) {
  CheckpointState st = weights_state(engine);
  int64_t largest = 0;
  for (const TensorShard& t : st.tensors) largest = std::max<int64_t>(largest, t.local.nbytes());
  auto sharded = tool::default_plugins()->create<CheckpointBackend>("sharded", std::map<std::string, std::string>{});
  const CheckpointContext ctx = checkpoint_context(groups, engine);
  groups.world()->barrier().wait();
  const int64_t rss_before = status_kib("VmRSS:");
  reset_peak_rss();
  const auto t0 = std::chrono::steady_clock::now();
  const bool dcp = load_checkpoint(dir, st, [&](CheckpointState& s) { sharded->load(dir, s, ctx); }, {});
  const double load_s = max_over_ranks(groups, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                                                   .count());
  const double rise = max_over_ranks(groups, (status_kib("VmHWM:") - rss_before) * 1024.0);
  const double largest_rows = max_over_ranks(groups, static_cast<double>(largest));
  const double bytes = static_cast<double>(engine.plan().total_params) * 4;
  if (groups.topology().rank == 0)
    std::printf("load %s (%s): %.0f MB of parameters in %.2f s = %.0f MB/s; the load adds at most %.1f MB of RSS on "
                "a rank (parameter shard: %.0f MB; the largest tensor's rows on a rank: %.1f MB)\n",
                dir.c_str(), dcp ? "PyTorch's DCP" : "fsdpx's", bytes / 1e6, load_s, bytes / 1e6 / load_s, rise / 1e6,
                engine.memory().param_bytes / 1e6, largest_rows / 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("fsdpx-ckpt-bench [--nproc-per-node N] [options]");
  desc.add_options()("dir", po::value<std::string>()->default_value("/tmp/fsdpx-ckpt-bench"), "where to write")(
      "dim", po::value<int>()->default_value(1024), "model width")(
      "layers", po::value<int>()->default_value(8), "layers")("vocab", po::value<int>()->default_value(32000),
                                                              "vocabulary")(
      "pool-mib", po::value<int64_t>()->default_value(2048), "the asynchronous save's staging pool (MiB per rank)")(
      "load", po::value<std::string>(), "only load this gpt's parameters from DIR (sharded, or PyTorch's DCP) and "
      "report the load's speed and the RSS it adds");
  tool::main(argc, argv, "fsdpx-ckpt-bench", desc, [](const po::variables_map& vm) {
    auto groups = tool::join_world();
    const int rank = groups->topology().rank, world = groups->topology().world_size;
    auto host = tool::default_plugins();
    auto model = host->create<Model>(
        "gpt", std::map<std::string, std::string>{{"dim", std::to_string(vm["dim"].as<int>())},
                                                  {"layers", std::to_string(vm["layers"].as<int>())},
                                                  {"heads", "16"},
                                                  {"vocab", std::to_string(vm["vocab"].as<int>())},
                                                  {"seq", "128"}});
    auto policy = host->create<WrapPolicy>("layer_type", std::map<std::string, std::string>{{"layer_types", "Block"}});
    EngineOptions eo;
    eo.layout = ShardingLayout{world, 1, true, false};
    EngineComms comms;
    comms.world = groups->world();
    if (world > 1) comms.shard = groups->world();
    ShardingEngine engine(model, policy->select(*model->module()), comms, eo);
    if (vm.count("load")) return load_only(*groups, engine, vm["load"].as<std::string>());
    auto opt = host->create<Optimizer>("adamw", std::map<std::string, std::string>{});
    opt->init(engine.shards());
    const int64_t params = engine.plan().total_params;
    const int64_t shard_bytes = engine.memory().param_bytes;
    if (rank == 0)
      std::printf(
          "gpt: %.1fM parameters, %.0f MB in fp32 (%d rank(s), %.0f MB of parameters per rank; with adamw state the "
          "checkpoint is 3x)\n",
          params / 1e6, params * 4 / 1e6, world, shard_bytes / 1e6);
    CheckpointContext ctx = checkpoint_context(*groups, engine);
    auto timed = [&](const std::function<void()>& f) {
      groups->world()->barrier().wait();
      const auto t0 = std::chrono::steady_clock::now();
      f();
      groups->world()->barrier().wait();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const fs::path root = vm["dir"].as<std::string>();
    for (const std::string backend : {"sharded", "consolidated"}) {
      auto b = host->create<CheckpointBackend>(backend, std::map<std::string, std::string>{});
      const std::string dir = (root / backend / "step-00000001").string();
      CheckpointState st = checkpoint_state(engine, *opt, /*for_load=*/false);
      st.step = 1;
      st.trainer_state_json = kTrainerState;  // what a load checks for
      const double save_s = timed([&] { b->save(dir, st, ctx); });
      st = CheckpointState();
      const double bytes = static_cast<double>(dir_bytes(dir));
      CheckpointState target = checkpoint_state(engine, *opt, /*for_load=*/true);
      const int64_t rss_before = status_kib("VmRSS:");
      reset_peak_rss();
      const double load_s = timed([&] { b->load(dir, target, ctx); });
      const int64_t rise = (status_kib("VmHWM:") - rss_before) * 1024;
      at::Tensor r = at::full({1}, rise, at::kLong);
      groups->world()->all_reduce(r, ReduceOp::Max).wait();
      if (rank == 0)
        std::printf(
            "%-12s %7.0f MB  save %6.2f s = %6.0f MB/s   load %6.2f s = %6.0f MB/s   load adds at most %5.0f MB of RSS "
            "on a "
            "rank (parameter shard: %.0f MB)\n",
            backend.c_str(), bytes / 1e6, save_s, bytes / 1e6 / save_s, load_s, bytes / 1e6 / load_s,
            r.item<int64_t>() / 1e6, shard_bytes / 1e6);
      groups->world()->barrier().wait();
      if (rank == 0) fs::remove_all(root / backend);
    }
    stall_table(*groups, *host, *model, engine, *opt, root, vm["pool-mib"].as<int64_t>(), vm["vocab"].as<int>());
    return 0;
  });
}
