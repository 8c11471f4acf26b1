// fsdpx-train: the training host. Composes a run from plugins (--<section>.name NAME and their
// options, or an INI file with --config), places the ranks (flags, torchrun, Slurm, or its own
// launcher with --nproc-per-node), and trains (fsdpx/framework/trainer/trainer.h). --dry-run plans without
// a process group; --check-comm verifies the runtime; --print-topology shows where a rank sits.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <iostream>

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <boost/program_options.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/launcher.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/trainer/trainer.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/framework/runtime/topology_resolver.h"

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
    ("check-collectives", "debug: before each collective the ranks compare op, dtype, element count, unit and phase "
     "(one small all-gather each); a mismatch stops the run naming both calls before anything hangs")
    ("device", po::value<std::string>()->default_value("cpu"), "cpu (Gloo) or cuda (NCCL, one GPU per local rank)");
  po::options_description actions("Actions");
  actions.add_options()
    ("dry-run", "print the plan (units, bytes per rank, bytes moved per step, dtypes) and exit; no process group")
    ("print-topology", "print this rank's resolved topology and exit (no rendezvous)")
    ("check-comm", "rendezvous, build the process groups and verify all-reduce, all-gather and barrier")
    ("skip-memory-check", "start even when the plan's peak per rank, times the ranks on this node, exceeds the memory "
     "the node has available (MemAvailable, or the memory cgroup's limit)")
    ("help,h", "this help");
  po::options_description plugins("Plugins");
  plugins.add_options()
    ("plugin-dir", po::value<std::vector<std::string>>()->composing(), "also load plugins from this directory")
    ("plugin", po::value<std::vector<std::string>>()->composing(), "also load this plugin file")
    ("allow-insecure-plugin-dir", "load plugins from world-writable or foreign-owned places");
  po::options_description all;
  all.add(fsdpx::TrainSettings::options()).add(topo).add(actions).add(plugins);
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

fsdpx::PluginSearch plugin_search(const std::vector<std::string>& args) {
  // The plugin flags are read before the configuration (which needs the plugins to parse).
  fsdpx::PluginSearch search;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&](const std::string& flag, std::vector<std::filesystem::path>& out) {
      if (args[i] == flag && i + 1 < args.size()) out.emplace_back(args[i + 1]);
      else if (args[i].rfind(flag + "=", 0) == 0) out.emplace_back(args[i].substr(flag.size() + 1));
    };
    value("--plugin-dir", search.dirs);
    value("--plugin", search.files);
    if (args[i] == "--allow-insecure-plugin-dir") search.allow_insecure = true;
  }
  return search;
}

struct Loaded {
  std::unique_ptr<fsdpx::PluginHost> host;
  fsdpx::RunConfig config;
};

// fsdpx-train's request: its options, the default components, and no checkpoint on request.
fsdpx::ConfigRequest config_request(const po::options_description& desc) {
  return fsdpx::ConfigRequest{&desc, fsdpx::default_components(), {fsdpx::Kind::Checkpoint}};
}

Loaded load(const std::vector<std::string>& args, const po::options_description& desc) {
  Loaded l{std::make_unique<fsdpx::PluginHost>(), {}};
  for (const auto& e : l.host->discover(plugin_search(args))) std::fprintf(stderr, "fsdpx-train: warning: %s\n", e.c_str());
  l.config = fsdpx::RunConfig::resolve(*l.host, args, config_request(desc));
  return l;
}

void print_help(const po::options_description& desc, const std::vector<std::string>& args) {
  std::cout << "usage: fsdpx-train [OPTIONS]\n"
               "  Trains a model composed from plugins; every option also works as a key of an INI file\n"
               "  given with --config (top-level keys for these, [section] name=... for components).\n\n"
            << desc << "\n" << fsdpx::component_choice_options(config_request(desc)) << "\n";
  try {
    std::vector<std::string> rest;
    for (const auto& a : args)
      if (a != "--help" && a != "-h") rest.push_back(a);
    Loaded l = load(rest, desc);
    std::cout << "Components of this run (change one with --<section>.name NAME; fsdpx-plugins list shows all):\n\n";
    for (const auto& [kind, choice] : l.config.components())
      std::cout << fsdpx::describe_component(l.host->find(kind, choice.name)) << "\n";
  } catch (const std::exception& e) {
    std::cout << "(the components' options cannot be listed: " << e.what() << ")\n";
  }
}

fsdpx::Topology launcher_topology(int nproc) {
  fsdpx::Topology t;
  t.world_size = t.local_world_size = nproc;
  return t;
}

bool has(const std::vector<std::string>& args, const char* flag) {
  return std::find(args.begin(), args.end(), flag) != args.end();
}

// --dry-run: the plan's text, and plan.json under --out when given.
void print_plan(const fsdpx::RunPlan& plan, const fsdpx::TrainSettings& settings) {
  std::cout << plan.text();
  if (settings.out_dir.empty()) return;
  std::filesystem::create_directories(settings.out_dir);
  fsdpx::write_plan_json(plan, (std::filesystem::path(settings.out_dir) / "plan.json").string());
}

// --deterministic: ATen's unvectorised kernels compute an element alike wherever it sits in a
// tensor (a vectorised kernel's scalar tail may round otherwise), so a shard's elements do not
// depend on where the shard boundaries fall. ATen reads this once, at its first kernel.
void choose_kernels(const po::variables_map& vm) {
  if (vm.count("deterministic") && vm["deterministic"].as<bool>()) ::setenv("ATEN_CPU_CAPABILITY", "default", 1);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  fsdpx::install_cpu_memory_accounting();  // before the first tensor: every CPU byte is counted
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  const auto desc = options();
  try {
    const fsdpx::LauncherArgs la = fsdpx::split_launcher_args(argc, argv);
    const std::vector<std::string> plain(la.rest.begin() + 1, la.rest.end());
    if (has(plain, "--help") || has(plain, "-h")) {
      print_help(desc, plain);
      return 0;
    }
    const bool launcher = la.nproc_per_node > 0 && !std::getenv("FSDPX_LAUNCHED");
    std::string kill_note;  // after a SIGKILLed worker: the plan's figure
    if (launcher && !has(plain, "--check-comm") && !has(plain, "--print-topology")) {
      // Check the whole configuration once, here, before any worker starts: a bad option gives
      // one line, not one per rank.
      Loaded l = load(plain, desc);
      auto settings = fsdpx::TrainSettings::from(l.config.host_values());
      if (l.config.host_values()["device"].as<std::string>() == "cuda" && !has(plain, "--dry-run"))
        throw fsdpx::Error("--device cuda: the sharding engine of this build computes on the CPU only (NCCL process groups "
                           "are built and checked by --check-comm); use --device cpu");
      auto plan = fsdpx::plan_run(*l.host, l.config, settings, launcher_topology(la.nproc_per_node));
      if (has(plain, "--dry-run")) {
        print_plan(plan, settings);
        return 0;
      }
      fsdpx::check_optimizer_runs_here(plan);
      if (!has(plain, "--skip-memory-check")) fsdpx::check_memory_fits(plan, la.nproc_per_node, fsdpx::resident_bytes());
      kill_note = "the plan's peak per rank is " + std::to_string(plan.memory.peak >> 20) + " MiB allocated (at " +
                  plan.memory.peak_where + "), and each process holds more besides";
      if (isatty(STDOUT_FILENO) || isatty(STDERR_FILENO)) ::setenv("FSDPX_PROGRESS", "1", 1);
    }
    std::vector<std::string> args;
    if (auto rc = fsdpx::launch_if_requested(argc, argv, "fsdpx-train", args, kill_note)) return *rc;
    Loaded l = load(args, desc);
    const po::variables_map& vm = l.config.host_values();
    choose_kernels(vm);
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
    ro.exit_on_peer_failure = true;  // a rank that fails ends the others with its message
    ro.check_collectives = vm.count("check-collectives") > 0;
    if (vm.count("check-comm")) return check_comm(ro);
    auto settings = fsdpx::TrainSettings::from(vm);
    if (vm.count("dry-run")) {
      auto plan = fsdpx::plan_run(*l.host, l.config, settings, ro.topology);
      if (ro.topology.rank == 0) print_plan(plan, settings);
      return 0;
    }
    if (!std::getenv("FSDPX_LAUNCHED") && !vm.count("skip-memory-check")) {
      // torchrun, Slurm or one process: every rank of a node sees the same memory before any allocates.
      auto plan = fsdpx::plan_run(*l.host, l.config, settings, ro.topology);
      fsdpx::check_memory_fits(plan, ro.topology.local_world_size, fsdpx::resident_bytes());
    }
    settings.progress_bar = ro.topology.rank == 0 && (std::getenv("FSDPX_PROGRESS") ? std::string(std::getenv("FSDPX_PROGRESS")) == "1"
                                                                                      : (isatty(STDOUT_FILENO) != 0));
    return fsdpx::train(*l.host, l.config, settings, ro);
  } catch (const po::error& e) {
    std::fprintf(stderr, "fsdpx-train: %s (see --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdpx-train: %s\n", e.what());
    return 1;
  }
}
