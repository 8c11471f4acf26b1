// fsdpx-engine-bench: training step time of the gpt plugin under full_shard (layer_type units),
// with the next unit's all-gather overlapped with compute and without, measured side by side in
// one run (alternating rounds, so machine noise hits both alike).
//
//   build/bin/fsdpx-engine-bench --nproc-per-node 2 [--size small] [--batch 8] [--seq 128]
//                                [--rounds 3] [--steps 5] [--threads 1]
#include <algorithm>
#include <chrono>
#include <cstdio>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/ops/randint.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/interfaces.h"
#include "tool.h"

using namespace fsdpx;
namespace po = boost::program_options;

namespace {

// One configuration under test: its model, engine and step times.
struct Arm {
  std::shared_ptr<Model> model;
  std::unique_ptr<ShardingEngine> engine;
  std::vector<double> times;
};

Arm make_arm(PluginHost& host, ProcessGroups& groups, const po::variables_map& vm, bool overlap) {
  Arm arm;
  arm.model = host.create<Model>(
      "gpt", {{"size", vm["size"].as<std::string>()}, {"seq", std::to_string(vm["seq"].as<int64_t>())}});
  EngineOptions eo;
  eo.layout = host.create<ShardingStrategy>("full_shard")->layout(groups.topology());
  eo.overlap = overlap;
  EngineComms comms{groups.world(), eo.layout.shard_group_size > 1 ? groups.world() : nullptr, nullptr,
                    groups.control(), {}};
  auto policy = host.create<WrapPolicy>("layer_type");
  arm.engine = std::make_unique<ShardingEngine>(arm.model, policy->select(*arm.model->module()), comms, eo);
  return arm;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("fsdpx-engine-bench [--nproc-per-node N] [options]");
  desc.add_options()("size", po::value<std::string>()->default_value("small"), "gpt size")
      ("batch", po::value<int64_t>()->default_value(8), "sequences per rank")
      ("seq", po::value<int64_t>()->default_value(128), "tokens per sequence")
      ("rounds", po::value<int>()->default_value(3), "alternating rounds of overlap on / off")
      ("steps", po::value<int>()->default_value(5), "timed steps per round")
      ("threads", po::value<int>()->default_value(1), "compute threads per rank");
  tool::main(argc, argv, "fsdpx-engine-bench", desc, [](const po::variables_map& vm) {
    at::set_num_threads(vm["threads"].as<int>());
    const int64_t batch = vm["batch"].as<int64_t>(), seq = vm["seq"].as<int64_t>();
    auto host = tool::default_plugins();
    auto groups = tool::join_world();
    const Topology& topo = groups->topology();
    Arm arms[2] = {make_arm(*host, *groups, vm, true), make_arm(*host, *groups, vm, false)};  // overlap on, off
    auto gen = at::make_generator<at::CPUGeneratorImpl>(topo.rank + 1);
    auto step = [&](Arm& arm) {
      at::Tensor t = at::randint(256, {batch, seq + 1}, gen, at::kLong);
      Batch b = next_token_batch(t);
      at::Tensor loss = arm.engine->forward([&] { return arm.model->loss(b); });
      arm.engine->backward(loss);
      at::NoGradGuard no_grad;
      for (auto& p : arm.engine->shards()) p.param.sub_(p.param.grad() * 1e-3);
      arm.engine->release_gradients();  // the next backward writes the gradients afresh
    };
    for (auto& arm : arms) step(arm), step(arm);  // warm-up: allocation, connections, forward order
    for (int r = 0; r < vm["rounds"].as<int>(); ++r)
      for (auto& arm : arms)
        for (int s = 0; s < vm["steps"].as<int>(); ++s) {
          groups->world()->barrier().wait();
          auto t0 = std::chrono::steady_clock::now();
          step(arm);
          groups->world()->barrier().wait();
          arm.times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
    if (topo.rank == 0) {
      const double on = median(arms[0].times), off = median(arms[1].times);
      std::printf(
          "fsdpx-engine-bench: gpt %s (%lld parameters), full_shard, %d ranks, batch %lld x %lld tokens per rank, %d "
          "thread(s) per rank\n",
          vm["size"].as<std::string>().c_str(), static_cast<long long>(arms[0].engine->plan().total_params),
          topo.world_size, static_cast<long long>(batch), static_cast<long long>(seq), vm["threads"].as<int>());
      std::printf("  step time, overlap on : %8.1f ms (median of %zu)\n", on * 1e3, arms[0].times.size());
      std::printf("  step time, overlap off: %8.1f ms (median of %zu)\n", off * 1e3, arms[1].times.size());
      std::printf("  off / on = %.3f\n", off / on);
    }
    return 0;
  });
}
