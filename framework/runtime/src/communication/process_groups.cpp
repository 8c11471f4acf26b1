#include "fsdpx/framework/runtime/process_groups.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <thread>

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "backend_communicator.h"
#include "failure_flag.h"
#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/c10d_backends.h"
#include "fsdpx/framework/runtime/device.h"
#include "message_text.h"
#include "peer_monitor.h"
#include "staged_communicator.h"

namespace fsdpx {
namespace {

// c10d logs its own warnings and errors (socket timeouts, retries) to stderr before fsdpx turns
// the failure into one clear message. Keep them out unless the user asked for LibTorch's logs
// (TORCH_CPP_LOG_LEVEL) or fsdpx's debug output (FSDPX_LOG=debug).
void quiet_c10d_logging() {
  const char* torch_level = std::getenv("TORCH_CPP_LOG_LEVEL");
  const char* fsdpx_log = std::getenv("FSDPX_LOG");
  if (torch_level || (fsdpx_log && std::string(fsdpx_log) == "debug")) return;
  FLAGS_caffe2_log_level = std::max<int>(FLAGS_caffe2_log_level, 3);  // fatal only
}

}  // namespace

DeviceKind device_kind(const std::string& spec) {
  if (spec == "cpu") return DeviceKind::Cpu;
  if (spec == "cuda") return DeviceKind::Cuda;
  if (spec == "sim") return DeviceKind::Sim;
  throw Error("--device must be cpu, cuda or sim, got '" + spec + "'");
}

const char* device_spec(DeviceKind device) {
  switch (device) {
    case DeviceKind::Cuda: return "cuda";
    case DeviceKind::Sim: return "sim";
    case DeviceKind::Cpu: break;
  }
  return "cpu";
}

bool nccl_collectives(DeviceKind device, Backend backend) {
  return device != DeviceKind::Cpu && backend != Backend::Gloo;
}

bool share_gpus_from_environment() {
  const char* v = std::getenv("FSDPX_SHARE_GPUS");
  if (!v || !*v || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw Error(std::string("FSDPX_SHARE_GPUS must be 1 (ranks share devices over NCCL) or 0, got '") + v + "'");
}

void check_device_trains(DeviceKind device, Backend backend, int local_ranks, bool share_devices) {
  check_device(device_spec(device), local_ranks,
               /*one_device_per_rank=*/nccl_collectives(device, backend) && !share_devices);
}

struct ProcessGroups::Impl {
  RuntimeOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<FlightRecorder> recorder = std::make_shared<FlightRecorder>();
  std::shared_ptr<PeerMonitor> monitor;
  std::shared_ptr<Communicator> world, control;
  std::map<std::string, int> groups_created;  // per (name, members): agreed by the members alone
  std::string nccl_pose;                       // what pose_as_nccl_node set, when ranks share devices

  bool nccl() const { return nccl_collectives(options.device, options.backend); }

  // Where a group's tensors live: the rank's device under NCCL (or sim's twin), else the CPU.
  c10::Device group_device(bool on_nccl) const {
    if (!on_nccl) return c10::Device(c10::kCPU);
    if (options.device == DeviceKind::Cuda) return c10::Device(c10::kCUDA);  // the current GPU
    return device_for_rank("sim", options.topology.local_rank);
  }

  // A device group: NCCL (sim: its twin), or Gloo staged through (pinned) host memory when the
  // device is not the CPU. `host_only`: Gloo on CPU tensors whatever the device (the control group).

  std::shared_ptr<Communicator> make(const std::string& name, const std::vector<int>& ranks, bool host_only = false) {
    const int me = options.topology.rank;
    auto it = std::find(ranks.begin(), ranks.end(), me);
    if (it == ranks.end())
      throw Error("rank " + std::to_string(me) + " asked to create group '" + name + "' (ranks " +
                  join_ints(ranks) + "), which does not include it");
    const int group_rank = static_cast<int>(it - ranks.begin());
    const int size = static_cast<int>(ranks.size());
    // A unique store namespace per group: its name, its members and its creation order.
    const std::string key = "fsdpx/group/" + name + "/" + join_ints(ranks);
    auto prefix = c10::make_intrusive<c10d::PrefixStore>(key + "/" + std::to_string(groups_created[key]++), store);
    c10::intrusive_ptr<c10d::Backend> backend;
    const bool on_nccl = nccl() && !host_only;
    try {
      if (on_nccl && options.device == DeviceKind::Sim) {
        backend = make_sim_nccl_twin(make_gloo_backend(prefix, group_rank, size, options.collective_timeout),
                                     options.topology.local_rank);
      } else if (on_nccl) {
        backend = make_nccl_backend(prefix, group_rank, size, options.collective_timeout,
                                    device_for_rank("cuda", options.topology.local_rank).index());
      } else {
        backend = make_gloo_backend(prefix, group_rank, size, options.collective_timeout);
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error("rank " + std::to_string(me) + ": creating group '" + name + "' (ranks " +
                  join_ints(ranks) + ") failed: " + first_line(e));
    }
    if (on_nccl) monitor->add_abort_hook([backend] { backend->abort(); });  // a lost peer: fail now
    auto c = std::make_shared<BackendCommunicator>(name, backend, ranks, me, monitor, options.collective_timeout,
                                                   recorder, options.check_collectives, group_device(on_nccl));
    if (on_nccl || host_only || options.device == DeviceKind::Cpu) return c;
    return std::make_shared<StagedCommunicator>(c, at::TensorOptions().pinned_memory(true));
  }
};

std::shared_ptr<ProcessGroups> ProcessGroups::create(const RuntimeOptions& options) {
  quiet_c10d_logging();
  Topology t = options.topology;
  if (t.master_port == 0 && t.world_size != 1)
    throw Error("master port 0 (any free port) serves only a single process; " + std::to_string(t.world_size) +
                " ranks need one port they all know (--master-port or MASTER_PORT)");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  // Before any communicator: NCCL reads its host id once per process.
  if (options.share_devices && impl->nccl() &&
      t.local_world_size > visible_device_count(device_spec(options.device)))
    impl->nccl_pose = pose_as_nccl_node(t);
  std::string master = t.master_addr + ":" + std::to_string(t.master_port);
  const auto timeout = options.rendezvous_timeout;
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(t.master_port);
    o.isServer = t.rank == 0;
    o.numWorkers = std::nullopt;
    o.waitWorkers = false;  // we wait ourselves, to name the ranks that are missing
    o.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(t.master_addr, o);
    impl->store = store;
    if (t.master_port == 0) {  // the kernel's pick, bound at once
      t.master_port = store->getPort();
      impl->options.topology.master_port = t.master_port;
      master = t.master_addr + ":" + std::to_string(t.master_port);
    }
  } catch (const std::exception& e) {
    if (t.rank == 0)
      throw Error("rank 0 cannot serve the rendezvous on port " + std::to_string(t.master_port) +
                  " (MASTER_PORT / --master-port): " + first_line(e));
    throw Error("rank " + std::to_string(t.rank) + " cannot reach the rendezvous master at " + master +
                " (MASTER_ADDR/MASTER_PORT) within " + seconds_text(timeout) +
                ": is rank 0 running, and are the address and port right? (" + first_line(e) + ")");
  }

  // Join: every rank announces itself, then waits for all the others.
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::vector<std::string> keys;
  for (int r = 0; r < t.world_size; ++r) keys.push_back("fsdpx/join/" + std::to_string(r));
  try {
    // "host pid node": where a rank lived, for the message that names it lost (PeerMonitor).
    impl->store->set(keys[t.rank],
                     std::string(host) + " " + std::to_string(::getpid()) + " " + std::to_string(t.node_rank));
    impl->store->wait(keys, timeout);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (int r = 0; r < t.world_size; ++r)
        if (!impl->store->check({keys[r]})) missing.push_back(r);
    } catch (const std::exception&) {
      throw Error("rank " + std::to_string(t.rank) + ": lost the rendezvous store at " + master +
                  " while waiting for the other ranks: " + first_line(e));
    }
    throw Error("rendezvous at " + master + " timed out after " + seconds_text(timeout) + ": " +
                std::to_string(t.world_size - static_cast<int>(missing.size())) + " of " +
                std::to_string(t.world_size) + " ranks joined; missing: rank" +
                (missing.size() == 1 ? " " : "s ") + join_ints(missing) +
                " (raise --rendezvous-timeout if they are only slow to start)");
  }
  try {
    impl->monitor = std::make_shared<PeerMonitor>(t, timeout, options.exit_on_peer_failure, impl->recorder,
                                                  options.watch_peers || impl->nccl());
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(t.rank) + ": cannot open the heartbeat connection to " +
                master + ": " + first_line(e));
  }
  std::vector<int> all(t.world_size);
  for (int r = 0; r < t.world_size; ++r) all[r] = r;
  impl->world = impl->make("world", all);
  impl->control = impl->make("control", all, /*host_only=*/true);
  return std::shared_ptr<ProcessGroups>(new ProcessGroups(std::move(impl)));
}

ProcessGroups::ProcessGroups(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroups::~ProcessGroups() {
  if (failure_seen().load()) {
    // Close this rank's connections first (unless a caller still holds the world group): a peer
    // blocked on them alone then fails now, while the store is still here to diagnose against.
    impl_->world.reset();
    impl_->control.reset();
    // Let peers finish diagnosing against this rank's heartbeat and, on rank 0, its store.
    std::this_thread::sleep_for(std::chrono::milliseconds(impl_->options.topology.rank == 0 ? 3000 : 1500));
  }
}

const Topology& ProcessGroups::topology() const { return impl_->options.topology; }
DeviceKind ProcessGroups::device() const { return impl_->options.device; }
const std::string& ProcessGroups::nccl_pose() const { return impl_->nccl_pose; }
std::shared_ptr<Communicator> ProcessGroups::world() const { return impl_->world; }
std::shared_ptr<Communicator> ProcessGroups::control() const { return impl_->control; }

void ProcessGroups::report_failure(const std::string& message) const {
  if (impl_->monitor) impl_->monitor->report_failure(message);
}

std::shared_ptr<Communicator> ProcessGroups::new_group(const std::string& name,
                                                       const std::vector<int>& ranks) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= impl_->options.topology.world_size || (i && ranks[i] <= ranks[i - 1]))
      throw Error("group '" + name + "': ranks (" + join_ints(ranks) +
                  ") must be ascending, distinct and below the world size " +
                  std::to_string(impl_->options.topology.world_size));
  }
  return impl_->make(name, ranks);
}

std::shared_ptr<Communicator> ProcessGroups::new_control_group(const std::string& name) const {
  std::vector<int> all(static_cast<size_t>(impl_->options.topology.world_size));
  for (size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
  return impl_->make(name, all, /*host_only=*/true);
}

ProcessGroups::Hybrid ProcessGroups::hybrid(int shard_size) {
  const Topology& t = impl_->options.topology;
  if (shard_size < 1 || t.world_size % shard_size != 0)
    throw Error("hybrid sharding: shard size " + std::to_string(shard_size) +
                " must divide the world size " + std::to_string(t.world_size));
  const int shard_index = t.rank / shard_size, within = t.rank % shard_size;
  std::vector<int> shard, replicate;
  for (int i = 0; i < shard_size; ++i) shard.push_back(shard_index * shard_size + i);
  for (int g = 0; g < t.world_size / shard_size; ++g) replicate.push_back(g * shard_size + within);
  Hybrid h;
  h.shard = impl_->make("shard", shard);
  h.replicate = impl_->make("replicate", replicate);
  return h;
}

}  // namespace fsdpx
