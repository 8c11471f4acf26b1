// fsdpx-train: the training host. Today it is the runtime's front end: topology from flags,
// torchrun or Slurm, the local launcher (--nproc-per-node), rendezvous and process groups, and a
// communication check. The training loop joins it with the sharding engine and trainer.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <boost/program_options.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/launcher.h"
#include "fsdpx/framework/process_groups.h"
#include "fsdpx/framework/topology_resolver.h"

namespace po = boost::program_options;

namespace {

po::options_description options() {
  po::options_description topo("Topology (flags win over torchrun's variables, which win over Slurm's)");
  topo.add_options()
    ("nproc-per-node", po::value<int>(), "start this many workers on this machine (local launcher)")
    ("rank", po::value<int>(), "global rank (else RANK, else SLURM_PROCID)")
    ("world-size", po::value<int>(), "number of ranks (else WORLD_SIZE, else SLURM_NTASKS)")
    ("local-rank", po::value<int>(), "rank within the node (else LOCAL_RANK, else SLURM_LOCALID)")
    ("local-world-size", po::value<int>(), "ranks on this node (else LOCAL_WORLD_SIZE, else Slurm's tasks per node)")
    ("node-rank", po::value<int>(), "index of this node (else GROUP_RANK, else SLURM_NODEID)")
    ("num-nodes", po::value<int>(), "number of nodes (else GROUP_WORLD_SIZE, else SLURM_NNODES)")
    ("master-addr", po::value<std::string>(), "rendezvous host (else MASTER_ADDR, else Slurm's first node)")
    ("master-port", po::value<int>(), "rendezvous port (else MASTER_PORT, else derived from SLURM_JOB_ID)")
    ("rendezvous-timeout", po::value<double>()->default_value(60), "seconds to wait for every rank to join")
    ("collective-timeout", po::value<double>()->default_value(300), "seconds before a collective is declared hung")
    ("device", po::value<std::string>()->default_value("cpu"), "cpu (Gloo) or cuda (NCCL, one GPU per local rank)");
  po::options_description actions("Actions");
  actions.add_options()
    ("print-topology", "print this rank's resolved topology and exit (no rendezvous)")
    ("check-comm", "rendezvous, build the process groups and verify all-reduce, all-gather and barrier")
    ("help,h", "this help");
  po::options_description all;
  all.add(topo).add(actions);
  return all;
}

fsdpx::TopologyFlags flags_from(const po::variables_map& vm) {
  fsdpx::TopologyFlags f;
  auto i = [&](const char* k, std::optional<int>& out) { if (vm.count(k)) out = vm[k].as<int>(); };
  i("rank", f.rank);
  i("world-size", f.world_size);
  i("local-rank", f.local_rank);
  i("local-world-size", f.local_world_size);
  i("node-rank", f.node_rank);
  i("num-nodes", f.num_nodes);
  i("master-port", f.master_port);
  if (vm.count("master-addr")) f.master_addr = vm["master-addr"].as<std::string>();
  return f;
}

std::chrono::milliseconds ms(const char* option, double seconds) {
  if (!(seconds >= 0.001 && seconds <= 1e7))
    throw fsdpx::Error(std::string("--") + option + " must be between 0.001 and 10000000 seconds, got " +
                       std::to_string(seconds));
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

int check_comm(const fsdpx::RuntimeOptions& ro) {
  auto start = std::chrono::steady_clock::now();
  auto groups = fsdpx::ProcessGroups::create(ro);
  auto world = groups->world();
  const int w = world->size(), r = world->rank();
  // CUDA: the device the NCCL backend made current.
  auto dev = ro.device == fsdpx::DeviceKind::Cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  at::Tensor sum = at::full({4}, static_cast<double>(r + 1), at::TensorOptions().device(dev));
  world->all_reduce(sum, fsdpx::ReduceOp::Sum).wait();
  const double expect = w * (w + 1) / 2.0;
  at::Tensor ids = at::full({1}, static_cast<double>(r), at::TensorOptions().device(dev));
  at::Tensor gathered = at::zeros({w}, at::TensorOptions().device(dev));
  world->all_gather(gathered, ids).wait();
  world->barrier().wait();
  if (!sum.cpu().eq(expect).all().item<bool>())
    throw fsdpx::Error("communication check failed on rank " + std::to_string(r) + ": all_reduce gave " +
                       std::to_string(sum.cpu()[0].item<double>()) + ", expected " + std::to_string(expect));
  if (!gathered.cpu().equal(at::arange(w).to(at::kFloat)))
    throw fsdpx::Error("communication check failed on rank " + std::to_string(r) +
                       ": all_gather of the ranks' ids did not give 0.." + std::to_string(w - 1));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (r == 0)
    std::printf("fsdpx-train: communication check passed on %d ranks (%s) in %.2f s\n", w,
                ro.device == fsdpx::DeviceKind::Cuda ? "nccl" : "gloo", secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    std::vector<std::string> args;
    if (auto rc = fsdpx::launch_if_requested(argc, argv, "fsdpx-train", args)) return *rc;
    po::variables_map vm;
    auto desc = options();
    po::positional_options_description none;  // stray words are errors, not ignored
    po::store(po::command_line_parser(args)
                  .options(desc)
                  .positional(none)
                  .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
                  .run(),
              vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << "usage: fsdpx-train [OPTIONS]\n" << desc << "\n";
      return 0;
    }
    auto resolved = fsdpx::resolve_topology(flags_from(vm), fsdpx::process_environment());
    if (vm.count("print-topology")) {
      const auto& t = resolved.topology;
      std::printf("topology rank=%d world_size=%d local_rank=%d local_world_size=%d node_rank=%d "
                  "num_nodes=%d master=%s:%d source=%s\n",
                  t.rank, t.world_size, t.local_rank, t.local_world_size, t.node_rank, t.num_nodes,
                  t.master_addr.c_str(), t.master_port, resolved.source.c_str());
      return 0;
    }
    const std::string device = vm["device"].as<std::string>();
    if (device != "cpu" && device != "cuda")
      throw fsdpx::Error("--device must be cpu or cuda, got '" + device + "'");
    fsdpx::RuntimeOptions ro;
    ro.topology = resolved.topology;
    ro.device = device == "cuda" ? fsdpx::DeviceKind::Cuda : fsdpx::DeviceKind::Cpu;
    ro.rendezvous_timeout = ms("rendezvous-timeout", vm["rendezvous-timeout"].as<double>());
    ro.collective_timeout = ms("collective-timeout", vm["collective-timeout"].as<double>());
    if (vm.count("check-comm")) return check_comm(ro);
    std::fprintf(stderr,
                 "fsdpx-train: training is not available in this build yet (it arrives with the "
                 "sharding engine and the trainer); --check-comm verifies the runtime, "
                 "--print-topology shows where this rank sits\n");
    return 2;
  } catch (const po::error& e) {
    std::fprintf(stderr, "fsdpx-train: %s (see --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdpx-train: %s\n", e.what());
    return 1;
  }
}
