// fsdpx-optim-bench: time of one optimizer step on one large parameter shard, for each
// optimizer plugin, side by side in one run.
//
//   build/bin/fsdpx-optim-bench [--numel 20000000] [--steps 5] [--threads 1] [--python VENV/bin/python]
//
// With --python (make bench passes the venv's), PyTorch's own optimizers run on a shard of the
// same size with the same threads in the same run: AdamW fused and foreach, SGD with momentum
// fused and foreach; each fsdpx line then gives its ratio to PyTorch's fastest of its kind.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>

#include "fsdpx/error.h"
#include "fsdpx/optimizer.h"
#include "tool.h"

using namespace fsdpx;
namespace po = boost::program_options;

namespace {

// PyTorch's optimizers on one shard of `n` elements, timed by `python` (median of `steps` after a
// warm-up). Empty without a Python.
struct TorchFigures {
  std::vector<std::pair<std::string, double>> ms;  // (optimizer as constructed, ms per step)
  std::map<std::string, double> fastest;           // "adamw" or "sgd" -> the fastest of that kind
};

TorchFigures torch_figures(const std::string& python, int64_t n, int steps, int threads) {
  TorchFigures out;
  if (python.empty()) return out;
  const std::string script =
      "import sys, time, torch\n"
      "n, steps, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])\n"
      "torch.set_num_threads(threads)\n"
      "def run(make):\n"
      "    p = torch.randn(n, requires_grad=True); p.grad = torch.randn(n) * 1e-3\n"
      "    o = make([p]); o.step(); ts = []\n"
      "    for _ in range(steps):\n"
      "        t = time.perf_counter(); o.step(); ts.append(time.perf_counter() - t)\n"
      "    return sorted(ts)[len(ts) // 2] * 1e3\n"
      "for kind, label, make in [\n"
      "    (\"adamw\", \"AdamW(fused=True)\", lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=True)),\n"
      "    (\"adamw\", \"AdamW(foreach=True)\", lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True)),\n"
      "    (\"sgd\", \"SGD(momentum=0.9, fused=True)\", lambda ps: torch.optim.SGD(ps, lr=1e-4, momentum=0.9, "
      "fused=True)),\n"
      "    (\"sgd\", \"SGD(momentum=0.9, foreach=True)\", lambda ps: torch.optim.SGD(ps, lr=1e-4, momentum=0.9, "
      "foreach=True))]:\n"
      "    print(kind, run(make), label)\n";
  const std::string cmd = python + " -c '" + script + "' " + std::to_string(n) + " " + std::to_string(steps) + " " +
                          std::to_string(threads);
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) throw Error("cannot run " + python);
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    std::istringstream in(line);
    std::string kind, label;
    double ms = 0;
    in >> kind >> ms;
    std::getline(in >> std::ws, label);
    out.ms.emplace_back(label, ms);
    out.fastest[kind] = out.fastest.count(kind) ? std::min(out.fastest[kind], ms) : ms;
  }
  if (::pclose(f) != 0 || out.ms.empty()) throw Error(python + " could not time PyTorch's optimizers");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("fsdpx-optim-bench [options]");
  desc.add_options()("numel", po::value<int64_t>()->default_value(20000000), "elements of the shard")(
      "steps", po::value<int>()->default_value(5), "timed steps per optimizer (after one warm-up)")(
      "threads", po::value<int>()->default_value(1), "intra-op threads (0: LibTorch's default)")(
      "python", po::value<std::string>()->default_value(""),
      "a Python with torch, to time PyTorch's optimizers beside");
  tool::main(argc, argv, "fsdpx-optim-bench", desc, [](const po::variables_map& vm) {
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
        {"anyprecision_adamw (fp32 shard, bf16 m, bf16 v)",
         "anyprecision_adamw",
         {{"momentum_dtype", "bf16"}},
         at::kFloat},
        {"anyprecision_adamw (bf16 shard, Kahan)",
         "anyprecision_adamw",
         {{"use_kahan_summation", "true"}},
         at::kBFloat16},
        {"sgd (momentum 0.9)", "sgd", {{"momentum", "0.9"}}, at::kFloat}};
    std::printf("fsdpx-optim-bench: one shard of %lld elements, %d threads\n", static_cast<long long>(n),
                at::get_num_threads());
    const TorchFigures torch =
        torch_figures(vm["python"].as<std::string>(), n, vm["steps"].as<int>(), at::get_num_threads());
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
      std::printf("  %-50s %9.1f ms/step  (%.2fx adamw)", c.label, med * 1e3, med / base);
      if (torch.fastest.count(c.name))  // the same algorithm in PyTorch: adamw and sgd
        std::printf("  %.2fx PyTorch's fastest %s", med * 1e3 / torch.fastest.at(c.name), c.name);
      std::printf("\n");
    }
    for (const auto& [label, ms] : torch.ms)
      std::printf("  PyTorch %-42s %9.1f ms/step\n", label.c_str(), ms);
    return 0;
  });
}
