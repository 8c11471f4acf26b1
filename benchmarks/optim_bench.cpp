// fsdpx-optim-bench: time of one optimizer step on one large parameter shard, for each
// optimizer plugin, side by side in one run.
//
//   build/bin/fsdpx-optim-bench [--numel 100000000] [--steps 5] [--threads 0 (all)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>

#include "fsdpx/error.h"
#include "fsdpx/optimizer.h"
#include "tool.h"

using namespace fsdpx;
namespace po = boost::program_options;

int main(int argc, char** argv) {
  po::options_description desc("fsdpx-optim-bench [options]");
  desc.add_options()("numel", po::value<int64_t>()->default_value(100000000), "elements of the shard")
      ("steps", po::value<int>()->default_value(5), "timed steps per optimizer (after one warm-up)")
      ("threads", po::value<int>()->default_value(0), "intra-op threads (0: LibTorch's default)");
  return tool::main(argc, argv, "fsdpx-optim-bench", desc, [](const po::variables_map& vm) {
    if (vm["threads"].as<int>() > 0) at::set_num_threads(vm["threads"].as<int>());
    auto host = tool::default_plugins();
    const int64_t n = vm["numel"].as<int64_t>();
    struct Case {
      const char* label;
      const char* name;
      std::map<std::string, std::string> options;
      at::ScalarType dtype;
    };
    const std::vector<Case> cases = {
        {"adamw (fp32 shard, fp32 moments)", "adamw", {}, at::kFloat},
        {"anyprecision_adamw (fp32 shard, fp32 m, bf16 v)", "anyprecision_adamw", {}, at::kFloat},
        {"anyprecision_adamw (bf16 shard, Kahan)", "anyprecision_adamw", {{"use_kahan_summation", "true"}}, at::kBFloat16},
        {"sgd (momentum 0.9)", "sgd", {{"momentum", "0.9"}}, at::kFloat}};
    std::printf("fsdpx-optim-bench: one shard of %lld elements, %d threads\n", static_cast<long long>(n),
                at::get_num_threads());
    double base = 0;
    for (const auto& c : cases) {
      auto opt = host->create<Optimizer>(c.name, c.options);
      at::Tensor p = at::randn({n}).to(c.dtype).requires_grad_(true);
      p.mutable_grad() = at::randn({n}).to(c.dtype) * 1e-3;
      opt->init({{"p", p}});
      opt->step(1e-4);  // warm-up: state allocation
      std::vector<double> times;
      for (int s = 0; s < vm["steps"].as<int>(); ++s) {
        auto t0 = std::chrono::steady_clock::now();
        opt->step(1e-4);
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(times.begin(), times.end());
      const double med = times[times.size() / 2];
      if (base == 0) base = med;
      std::printf("  %-50s %9.1f ms/step  (%.2fx adamw)\n", c.label, med * 1e3, med / base);
    }
    return 0;
  });
}
