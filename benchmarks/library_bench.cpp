// fsdpx-library-bench: the gpt model plugin trained through fsdpx::fully_shard in a plain loop
// (the library's path: the user's loop, not fsdpx-train's), each rank writing one JSON line per
// step to OUT.rankN: {"step", "loss", "step_time_s"}. benchmarks/library_vs_train.py runs it beside
// fsdpx-train on the same model, data, seed and plugins and prints their step times' ratio.
//
//   build/bin/fsdpx-library-bench --nproc-per-node 2 --size small --seq 128 --batch-size 8
//                                 --steps 10 --sharding full_shard --optimizer adamw|torch-adamw --out PREFIX
#include <chrono>
#include <cstdio>
#include <fstream>

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adamw.h>

#include "fsdpx/data_source.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/fully_shard.h"
#include "tool.h"

using namespace fsdpx;
namespace po = boost::program_options;

namespace {

int run(const po::variables_map& vm) {
  Runtime rt;
  const auto seq = std::to_string(vm["seq"].as<int64_t>());
  auto model = rt.plugins().create<Model>("gpt", {{"size", vm["size"].as<std::string>()}, {"seq", seq}});
  auto data = rt.plugins().create<DataSource>("synthetic", {{"seq", seq}});
  const uint64_t seed = vm["seed"].as<uint64_t>();
  data->open(DataContext{rt.rank(), rt.world_size(), vm["batch-size"].as<int64_t>(), seed});
  ShardOptions o;
  o.sharding = vm["sharding"].as<std::string>();
  o.wrap_options = {{"layer_types", "Block"}};
  o.seed = seed;
  auto fsdp = fully_shard(rt, model, o);
  // torch-adamw: torch::optim::AdamW over the module's parameters (this rank's shards), with the
  // adamw plugin's defaults, and loss.backward(): the way FSDP2's users write the loop.
  const bool torch_adamw = vm["optimizer"].as<std::string>() == "torch-adamw";
  std::shared_ptr<Optimizer> opt;
  std::unique_ptr<torch::optim::AdamW> topt;
  if (torch_adamw)
    topt = std::make_unique<torch::optim::AdamW>(model->module()->parameters(),
                                                 torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
  else
    opt = fsdp->optimizer(vm["optimizer"].as<std::string>());
  std::ofstream out(vm["out"].as<std::string>() + ".rank" + std::to_string(rt.rank()));
  for (int step = 1; step <= vm["steps"].as<int>(); ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const Batch b = data->next();
    at::Tensor loss = fsdp->forward([&] { return model->loss(b); });
    if (topt) {
      loss.backward();
      topt->step();
      topt->zero_grad();
    } else {
      fsdp->backward(loss);
      opt->step(opt->base_lr());
      fsdp->zero_grad();
    }
    const double l = loss.item<double>();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char line[160];
    std::snprintf(line, sizeof line, "{\"step\": %d, \"loss\": %.17g, \"step_time_s\": %.9g}\n", step, l, s);
    out << line << std::flush;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("fsdpx-library-bench [--nproc-per-node N] [options]");
  desc.add_options()("size", po::value<std::string>()->default_value("small"), "gpt size")
      ("seq", po::value<int64_t>()->default_value(128), "tokens per sequence (synthetic data)")
      ("batch-size", po::value<int64_t>()->default_value(8), "sequences per rank")
      ("steps", po::value<int>()->default_value(10), "steps")
      ("seed", po::value<uint64_t>()->default_value(0), "the parameters' and the data's seed, as fsdpx-train's")
      ("sharding", po::value<std::string>()->default_value("full_shard"), "a sharding plugin")
      ("optimizer", po::value<std::string>()->default_value("adamw"),
       "an optimizer plugin, its defaults; torch-adamw: torch::optim::AdamW over the shards with the adamw plugin's "
       "defaults")
      ("out", po::value<std::string>()->required(), "each rank writes OUT.rankN");
  tool::main(argc, argv, "fsdpx-library-bench", desc, run);
}
