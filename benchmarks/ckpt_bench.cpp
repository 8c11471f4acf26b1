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
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ops/full.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
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

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("fsdpx-ckpt-bench [--nproc-per-node N] [options]");
  desc.add_options()("dir", po::value<std::string>()->default_value("/tmp/fsdpx-ckpt-bench"), "where to write")(
      "dim", po::value<int>()->default_value(1024), "model width")(
      "layers", po::value<int>()->default_value(8), "layers")("vocab", po::value<int>()->default_value(32000),
                                                              "vocabulary");
  return tool::main(argc, argv, "fsdpx-ckpt-bench", desc, [](const po::variables_map& vm) {
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
    return 0;
  });
}
