// fsdpx-comm-bench: all-gather and reduce-scatter throughput of the world group, as the
// sharding engine uses them (one flat buffer per call).
//
//   build/bin/fsdpx-comm-bench --nproc-per-node 2 [--sizes-mib 1,16,64] [--dtype fp32|bf16]
//
// Prints, on rank 0, for each size: time per call, algorithm bandwidth (buffer bytes / time)
// and bus bandwidth (algbw x (n-1)/n, what each rank moves, comparable across world sizes).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>

#include "fsdpx/framework/runtime/topology_resolver.h"
#include "tool.h"

using namespace fsdpx;
namespace po = boost::program_options;

int main(int argc, char** argv) {
  po::options_description desc("fsdpx-comm-bench [--nproc-per-node N] [options]");
  desc.add_options()("sizes-mib", po::value<std::string>()->default_value("1,16,64"), "buffer sizes in MiB")
      ("dtype", po::value<std::string>()->default_value("fp32"), "fp32 or bf16")
      ("seconds", po::value<double>()->default_value(2.0), "time budget per size and collective");
  tool::main(argc, argv, "fsdpx-comm-bench", desc, [](const po::variables_map& vm) {
    const auto dtype = vm["dtype"].as<std::string>() == "bf16" ? at::kBFloat16 : at::kFloat;
    auto groups = tool::join_world();
    auto world = groups->world();
    const int n = world->size();
    if (world->rank() == 0)
      std::printf("fsdpx-comm-bench: %d ranks, gloo, %s, %s\n%-14s %6s %11s %12s %12s %14s\n", n,
                  vm["dtype"].as<std::string>().c_str(), describe(resolve_topology({}, process_environment())).c_str(),
                  "collective", "MiB", "ms/call", "algbw GB/s", "busbw GB/s", "wire/formula");
    std::stringstream sizes(vm["sizes-mib"].as<std::string>());
    for (std::string item; std::getline(sizes, item, ',');) {
      const int64_t bytes = static_cast<int64_t>(std::stod(item) * 1024 * 1024);
      const int64_t elems = bytes / at::elementSize(dtype) / n * n;
      at::Tensor full = at::ones({elems}, dtype), shard = at::empty({elems / n}, dtype);
      for (const char* what : {"all_gather", "reduce_scatter"}) {
        auto call = [&] {
          if (std::string(what) == "all_gather") world->all_gather(full, shard).wait();
          else world->reduce_scatter(shard, full, ReduceOp::Sum).wait();
        };
        call();  // warm-up (connections, allocation)
        // Ranks agree on the iteration count: rank 0 measures one call and broadcasts.
        auto t0 = std::chrono::steady_clock::now();
        call();
        double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        at::Tensor iters = at::ones({1}) * std::max(3.0, std::min(200.0, vm["seconds"].as<double>() / one));
        world->broadcast(iters, 0).wait();
        const int k = static_cast<int>(iters.item<float>());
        world->barrier().wait();
        const int64_t wire0 = tcp_bytes_sent();
        t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < k; ++i) call();
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / k;
        world->barrier().wait();
        const double wire = static_cast<double>(tcp_bytes_sent() - wire0) / k;
        double algbw = static_cast<double>(elems * at::elementSize(dtype)) / secs / 1e9;
        if (world->rank() == 0)
          std::printf("%-14s %6s %11.3f %12.3f %12.3f %14.3f\n", what, item.c_str(), secs * 1e3, algbw,
                      algbw * (n - 1) / n, wire / (static_cast<double>(elems * at::elementSize(dtype)) * (n - 1) / n));
      }
    }
    return 0;
  });
}
