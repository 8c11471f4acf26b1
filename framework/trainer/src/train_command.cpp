#include "fsdpx/framework/trainer/train_command.h"

#include <string>
#include <vector>

#include "fsdpx/error.h"
#include "fsdpx/framework/plugin_host/host_options.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/framework/trainer/trainer.h"

namespace po = boost::program_options;

namespace fsdpx {
namespace {

// The flags that place a rank; the local launcher sets each of them for its workers.
const char* const kPlacement[] = {"rank", "world-size", "local-rank", "local-world-size", "node-rank", "num-nodes"};
const char* const kActions[] = {"dry-run", "plan-search", "check-comm", "print-topology"};

po::options_description topology_options() {
  constexpr int kMaxRanks = 1 << 20;
  po::options_description topo("Topology (flags win over torchrun's variables, which win over Slurm's)");
  topo.add_options()
    ("nproc-per-node", int_value<int>({1, 1024}), "start this many workers on this machine (local launcher)")
    ("rank", int_value<int>({0, kMaxRanks - 1}), "global rank (else RANK, else SLURM_PROCID)")
    ("world-size", int_value<int>({1, kMaxRanks}), "number of ranks (else WORLD_SIZE, else SLURM_NTASKS)")
    ("local-rank", int_value<int>({0, kMaxRanks - 1}), "rank within the node (else LOCAL_RANK, else SLURM_LOCALID)")
    ("local-world-size", int_value<int>({1, kMaxRanks}),
     "ranks on this node (else LOCAL_WORLD_SIZE, else Slurm's tasks per node)")
    ("node-rank", int_value<int>({0, kMaxRanks - 1}), "index of this node (else GROUP_RANK, else SLURM_NODEID)")
    ("num-nodes", int_value<int>({1, kMaxRanks}), "number of nodes (else GROUP_WORLD_SIZE, else SLURM_NNODES)")
    ("master-addr", po::value<std::string>(), "rendezvous host (else MASTER_ADDR, else Slurm's first node)")
    ("master-port", int_value<int>({1, 65535}), "rendezvous port (else MASTER_PORT, else derived from SLURM_JOB_ID)")
    ("rendezvous-timeout", float_value(FloatRange::closed(0.001, 1e7))->default_value(60),
     "seconds to wait for every rank to join")
    ("collective-timeout", float_value(FloatRange::closed(0.001, 1e7))->default_value(300),
     "seconds before a collective is declared hung")
    ("check-collectives", po::bool_switch(),
     "debug: before each collective the ranks compare op, dtype, element count, unit and phase "
     "(one small all-gather each); a mismatch stops the run naming both calls before anything hangs")
    ("device", po::value<std::string>()->default_value("cpu"),
     "cpu, cuda (a GPU per local rank with NCCL) or sim (fsdpx's simulated accelerator, libfsdpx_sim.so)")
    ("backend", po::value<std::string>()->default_value("default"),
     "the device's collectives: default (NCCL on cuda, its NCCL twin on sim, Gloo on cpu), nccl, or gloo "
     "(device tensors staged through host memory: several ranks may share a device)")
    ("share-gpus", po::bool_switch(),
     "with NCCL (cuda, or sim's twin), more ranks on this node than devices: the ranks go round-robin over the "
     "devices, each a node of its own to NCCL (its own NCCL_HOSTID; sockets on loopback), and the memory check adds "
     "up the ranks on a device. For tests and for checking a run on fewer GPUs than its cluster: the bytes go over "
     "sockets, so its speed is not a cluster's (FSDPX_SHARE_GPUS=1 does the same)")
    ("watch-peers", po::bool_switch(),
     "each rank watches the next one's heartbeat and names a lost rank within seconds, aborting the collectives "
     "that wait for it (always on with NCCL)");
  return topo;
}

}  // namespace

po::options_description train_command_options() {
  po::options_description actions("Actions (command line only; one at a time)");
  actions.add_options()
    ("dry-run", "print the plan (units, bytes per rank, bytes moved per step, dtypes) and exit; no process group")
    ("plan-search", "plan every composition the configuration leaves open (sharding, units and recompute, "
     "--optimizer-in-backward, precision, micro-batch x accumulation of the samples per step), keep what fits, "
     "and print the fastest by predicted time with their command lines; no process group")
    ("print-topology", "print this rank's resolved topology and exit (no rendezvous)")
    ("check-comm", "rendezvous, build the process groups and verify all-reduce, all-gather and barrier")
    ("help,h", "this help");
  po::options_description memory("Memory (command line only)");
  memory.add_options()
    ("skip-memory-check", "start even when the plan does not fit: the step's peak per rank on the device (CUDA's "
     "free memory, sim's budget FSDPX_SIM_MEMORY), or the bytes per rank in host memory times the ranks on this node "
     "(MemAvailable, or the memory cgroup's limit)");
  po::options_description plugins(
      "Plugins (--plugin-dir and --plugin also as keys of --config; config.ini records them)");
  plugins.add_options()
    ("plugin-dir", po::value<std::vector<std::string>>()->composing(), "also load plugins from this directory")
    ("plugin", po::value<std::vector<std::string>>()->composing(), "also load this plugin file (it must load)")
    ("allow-insecure-plugin-dir", "load plugins from world-writable or foreign-owned places (command line only)")
    ("skip-broken-plugins", "a plugin file of a scanned folder (--plugin-dir, FSDPX_PLUGIN_PATH, the default one) "
     "that fails to load is a warning, not an error; a --plugin file must still load (command line only)");
  po::options_description all;
  all.add(TrainSettings::options()).add(topology_options()).add(actions).add(memory).add(plugins);
  return all;
}

ConfigRequest train_config_request(const po::options_description& options) {
  ConfigRequest request{&options, default_components(), {Kind::Checkpoint}};
  request.command_line_only = {"nproc-per-node", "dry-run", "plan-search", "check-comm", "print-topology", "help",
                               "allow-insecure-plugin-dir", "skip-broken-plugins", "skip-memory-check"};
  return request;
}

void check_train_flags(const RunConfig& config, int nproc_per_node) {
  const HostValues& vm = config.host_values();
  std::vector<std::string> actions;
  for (const char* a : kActions)
    if (vm.count(a)) actions.push_back(std::string("--") + a);
  if (actions.size() > 1)
    throw Error(actions[0] + " and " + actions[1] + " cannot go together: each is an action of its own; give one");
  if (nproc_per_node > 0)
    for (const char* p : kPlacement)
      if (vm.count(p))
        throw Error(std::string("--nproc-per-node and --") + p + " cannot go together: the launcher places the " +
                    std::to_string(nproc_per_node) + " ranks it starts itself; drop --" + p +
                    " (or start one process per rank without --nproc-per-node)");
  if (vm["share-gpus"].as<bool>() && !nccl_collectives(device_of(vm), backend_of(vm)))
    throw Error("--share-gpus lets ranks share devices over NCCL, and this run's collectives are Gloo's (--device " +
                vm["device"].as<std::string>() + (backend_of(vm) == Backend::Gloo ? ", --backend gloo" : "") +
                "), where ranks may share a device without it; drop --share-gpus");
  backend_of(vm);  // and the device
  const std::string resume = vm["resume"].as<std::string>(), save_init = vm["save-init"].as<std::string>();
  const char* needs_checkpoint = vm["save-every"].as<int64_t>() > 0 ? "--save-every"
                                 : vm["keep-last"].as<int64_t>() > 0 ? "--keep-last"
                                 : !resume.empty()                   ? "--resume"
                                                                     : nullptr;
  if (needs_checkpoint && !config.choice(Kind::Checkpoint))
    throw Error(std::string(needs_checkpoint) + " needs a checkpoint component, and the run has none: add "
                "--checkpoint.name sharded (or [checkpoint] name=sharded)");
  if (!save_init.empty() && !resume.empty() && resume != "auto")
    throw Error("--save-init and --resume " + resume + " cannot go together: the run starts from the checkpoint's "
                "weights, not from the initial weights --save-init would write");
}

DeviceKind device_of(const HostValues& vm) {
  return device_kind(vm["device"].as<std::string>());
}

Backend backend_of(const HostValues& vm) {
  const std::string backend = vm["backend"].as<std::string>();
  const DeviceKind device = device_of(vm);
  if (backend == "default") return Backend::Default;
  if (backend == "gloo") return Backend::Gloo;
  if (backend != "nccl") throw Error("--backend must be default, nccl or gloo, got '" + backend + "'");
  if (device == DeviceKind::Cpu)
    throw Error("--backend nccl needs --device cuda, or --device sim (its NCCL twin): NCCL moves device memory "
                "only, and this run has --device cpu");
  return Backend::Nccl;
}

RuntimeOptions runtime_options(const HostValues& vm, const Topology& topology) {
  auto ms = [](double seconds) { return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)); };
  RuntimeOptions ro;
  ro.topology = topology;
  ro.device = device_of(vm);
  ro.backend = backend_of(vm);
  ro.watch_peers = vm["watch-peers"].as<bool>();
  ro.share_devices = vm["share-gpus"].as<bool>() || share_gpus_from_environment();
  ro.rendezvous_timeout = ms(vm["rendezvous-timeout"].as<double>());  // within the declared range
  ro.collective_timeout = ms(vm["collective-timeout"].as<double>());
  ro.exit_on_peer_failure = true;                             // a rank that fails ends the others with its message
  ro.check_collectives = vm["check-collectives"].as<bool>();  // "check-collectives = false" in a file: off
  return ro;
}

TopologyFlags topology_flags(const HostValues& vm) {
  TopologyFlags f;
  auto i = [&](const char* k, std::optional<int>& out) {
    if (vm.count(k)) out = vm[k].as<int>();
  };
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

}  // namespace fsdpx
