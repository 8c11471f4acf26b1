// fsdpx-train: the training host. Composes a run from plugins (--<section>.name NAME and their
// options, or an INI file with --config), places the ranks (flags, torchrun, Slurm, or its own
// launcher with --nproc-per-node), and trains (fsdpx/framework/trainer/trainer.h). --dry-run plans without
// a process group; --check-comm verifies the runtime; --print-topology shows where a rank sits.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <boost/program_options.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/program_options.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/launcher.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/framework/runtime/topology_resolver.h"
#include "fsdpx/framework/trainer/plan_search.h"
#include "fsdpx/framework/trainer/run_directory.h"
#include "fsdpx/framework/trainer/train_command.h"
#include "fsdpx/framework/trainer/trainer.h"

namespace po = boost::program_options;

namespace {

// The compositions --plan-search prints, fastest first.
constexpr size_t kSearchTop = 10;

// Every option of fsdpx-train (fsdpx/framework/trainer/train_command.h, where the fuzz target of the
// --dry-run path finds them too).
po::options_description options() { return fsdpx::train_command_options(); }

int check_comm(const fsdpx::RuntimeOptions& ro) {
  auto start = std::chrono::steady_clock::now();
  auto groups = fsdpx::ProcessGroups::create(ro);
  auto world = groups->world();
  const int w = world->size(), r = world->rank();
  const at::Device dev = fsdpx::open_device(fsdpx::device_spec(ro.device), ro.topology.local_rank)->device();
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
                dev.is_cpu()                                     ? "gloo"
                : !fsdpx::nccl_collectives(ro.device, ro.backend) ? "gloo, staged"
                : dev.is_cuda()                                  ? "nccl"
                                                                 : "sim's nccl twin",
                secs);
  return 0;
}

struct Loaded {
  std::unique_ptr<fsdpx::PluginHost> host;
  fsdpx::RunConfig config;
};

// The plugins (a named one must load) and the configuration; refuses flags that cannot go together.
Loaded load(const std::vector<std::string>& args, const po::options_description& desc, int nproc_per_node = 0) {
  Loaded l{std::make_unique<fsdpx::PluginHost>(), {}};
  for (const auto& e : l.host->discover(fsdpx::plugin_search(args)))
    std::fprintf(stderr, "fsdpx-train: warning: %s\n", e.c_str());
  l.config = fsdpx::RunConfig::resolve(*l.host, args, fsdpx::train_config_request(desc));
  fsdpx::check_train_flags(l.config, nproc_per_node);
  return l;
}

void print_help(const po::options_description& desc, const std::vector<std::string>& args) {
  std::cout << "usage: fsdpx-train [OPTIONS]\n"
               "  Trains a model composed from plugins; every option also works as a key of an INI file\n"
               "  given with --config (top-level keys for these, [section] name=... for components).\n\n"
            << desc << "\n" << fsdpx::component_choice_options(fsdpx::train_config_request(desc)) << "\n";
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

// --dry-run: the plan's text with the memory check's sides (as before a launch: the device's when
// it can be read without a GPU), and plan.json under --out when given (unless a run holds --out).
void print_plan(const fsdpx::RunPlan& plan, const fsdpx::TrainSettings& settings) {
  std::cout << plan.text()
            << fsdpx::memory_fit_before_launch(plan, plan.topology.local_world_size, fsdpx::resident_bytes()).text();
  if (settings.out_dir.empty()) return;
  fsdpx::RunDirectory::check_not_in_use(settings.out_dir);
  std::filesystem::create_directories(settings.out_dir);
  fsdpx::write_plan_json(plan, (std::filesystem::path(settings.out_dir) / "plan.json").string());
}

// --deterministic: ATen's unvectorised kernels compute an element alike wherever it sits in a
// tensor (a vectorised kernel's scalar tail may round otherwise), so a shard's elements do not
// depend on where the shard boundaries fall. ATen reads this once, at its first kernel.
void choose_kernels(const fsdpx::HostValues& vm) {
  if (vm.count("deterministic") && vm["deterministic"].as<bool>()) ::setenv("ATEN_CPU_CAPABILITY", "default", 1);
}

// --plan-search: the search's table on rank 0 (every rank plans the same), and search.json under
// --out when given; 1 when nothing fits.
int plan_search(const Loaded& l, const std::vector<std::string>& args, const po::options_description& desc,
                const fsdpx::Topology& topology, int nproc = 0) {
  fsdpx::PlanSearch search = fsdpx::search_plans(*l.host, args, fsdpx::train_config_request(desc), topology);
  if (nproc > 0) search.program += " --nproc-per-node " + std::to_string(nproc);
  if (topology.rank != 0) return search.fitting.empty() ? 1 : 0;
  std::cout << search.text(kSearchTop);
  const std::string out = fsdpx::TrainSettings::from(l.config.host_values()).out_dir;
  if (!out.empty()) {
    fsdpx::RunDirectory::check_not_in_use(out);
    std::filesystem::create_directories(out);
    std::ofstream(std::filesystem::path(out) / "search.json") << search.json();
  }
  return search.fitting.empty() ? 1 : 0;
}

// With --nproc-per-node: the whole configuration, checked once, here, before any worker starts (a
// bad option gives one line, not one per rank). --dry-run ends here: returns its status then.
std::optional<int> check_before_launch(const std::vector<std::string>& plain, const po::options_description& desc,
                                       int nproc, std::string& kill_note) {
  Loaded l = load(plain, desc, nproc);
  if (has(plain, "--check-comm") || has(plain, "--print-topology")) return std::nullopt;
  if (has(plain, "--plan-search")) return plan_search(l, plain, desc, launcher_topology(nproc), nproc);
  auto settings = fsdpx::TrainSettings::from(l.config.host_values());
  const fsdpx::HostValues& vm = l.config.host_values();
  fsdpx::topology_flags(vm);  // the workers read these flags; read here, the plan sees each flag read
  const fsdpx::RuntimeOptions ro = fsdpx::runtime_options(vm, launcher_topology(nproc));
  if (!has(plain, "--dry-run")) fsdpx::check_device_trains(ro.device, ro.backend, nproc, ro.share_devices);
  auto plan = fsdpx::plan_run(*l.host, l.config, settings, launcher_topology(nproc));
  if (has(plain, "--dry-run")) {
    print_plan(plan, settings);
    return 0;
  }
  fsdpx::check_optimizer_runs_here(plan);
  fsdpx::RunDirectory::check_not_in_use(settings.out_dir);  // a run holds it: refused before any worker starts
  // The node's host memory for every rank, and sim's budget; a GPU's free memory is each rank's
  // to read (this process must not initialise CUDA before it forks the workers).
  if (!has(plain, "--skip-memory-check"))
    fsdpx::check_memory_fits(plan, fsdpx::memory_fit_before_launch(plan, nproc, fsdpx::resident_bytes()));
  kill_note = "the plan's peak per rank is " + std::to_string(plan.memory.peak >> 20) + " MiB allocated (at " +
              plan.memory.peak_where + "), and each process holds more besides";
  if (isatty(STDOUT_FILENO) || isatty(STDERR_FILENO)) ::setenv("FSDPX_PROGRESS", "1", 1);
  return std::nullopt;
}

int main_body(int argc, char** argv) {
  // With --nproc-per-node: the workers, forked now while this process holds one thread; each
  // goes on from here once the launcher below hands it its environment.
  fsdpx::fork_workers_early(argc, argv, {"--help", "-h", "--dry-run", "--plan-search"});
  // A rank whose peer died writes to a closed socket: the write must fail (EPIPE, a collective
  // error that names the lost ranks) instead of ending this rank at once by SIGPIPE's default,
  // before it can say anything (slurm_two_nodes saw rank 0 end as "task 0: Broken pipe").
  std::signal(SIGPIPE, SIG_IGN);
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
    if (launcher)
      if (auto rc = check_before_launch(plain, desc, la.nproc_per_node, kill_note)) return *rc;
    std::vector<std::string> args;
    if (auto rc = fsdpx::launch_if_requested(argc, argv, "fsdpx-train", args, kill_note)) return *rc;
    Loaded l = load(args, desc);
    const fsdpx::HostValues& vm = l.config.host_values();
    choose_kernels(vm);
    auto resolved = fsdpx::resolve_topology(fsdpx::topology_flags(vm), fsdpx::process_environment());
    if (vm.count("print-topology")) {
      const auto& t = resolved.topology;
      std::printf("topology rank=%d world_size=%d local_rank=%d local_world_size=%d node_rank=%d "
                  "num_nodes=%d master=%s:%d source=%s\n",
                  t.rank, t.world_size, t.local_rank, t.local_world_size, t.node_rank, t.num_nodes,
                  t.master_addr.c_str(), t.master_port, resolved.source.c_str());
      return 0;
    }
    const fsdpx::RuntimeOptions ro = fsdpx::runtime_options(vm, resolved.topology);
    if (vm.count("check-comm")) return check_comm(ro);
    auto settings = fsdpx::TrainSettings::from(vm);
    if (vm.count("plan-search")) return plan_search(l, args, desc, ro.topology);
    if (vm.count("dry-run")) {
      auto plan = fsdpx::plan_run(*l.host, l.config, settings, ro.topology);
      if (ro.topology.rank == 0) print_plan(plan, settings);
      return 0;
    }
    // The ranks agree on the memory check after the rendezvous (fsdpx::train); under this
    // program's launcher, which checked the node's host memory before starting them, on the device's.
    settings.host_memory_checked = std::getenv("FSDPX_LAUNCHED") != nullptr;
    settings.progress_bar =
        ro.topology.rank == 0 && (std::getenv("FSDPX_PROGRESS") ? std::string(std::getenv("FSDPX_PROGRESS")) == "1"
                                                                : (isatty(STDOUT_FILENO) != 0));
    return fsdpx::train(*l.host, l.config, settings, ro);
  } catch (const po::error& e) {
    std::fprintf(stderr, "fsdpx-train: %s (see --help)\n", fsdpx::option_error_text(e).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdpx-train: %s\n", fsdpx::message_of(e).c_str());
    return 1;
  }
}

}  // namespace

// The process ends without the teardown of LibTorch's static objects (fsdpx::exit_process).
int main(int argc, char** argv) { fsdpx::exit_process(main_body(argc, argv)); }
