// ProcessGroups: rendezvous, the world group, and the sub-groups hybrid sharding needs.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fsdpx/export.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/topology.h"

namespace fsdpx {

enum class DeviceKind { Cpu, Cuda, Sim };
// The kind of `--device` spec: "cpu", "cuda" or "sim"; throws fsdpx::Error naming the three otherwise.
FSDPX_API DeviceKind device_kind(const std::string& spec);
// "cpu", "cuda" or "sim": the spec device_kind reads and open_device (device.h) takes.
FSDPX_API const char* device_spec(DeviceKind device);
// Which library carries the device groups' collectives: NCCL (CUDA, a GPU per rank; on sim, its
// NCCL twin, devices/sim's fsdpx/sim/sim_nccl.h), or Gloo, staging device tensors through host
// memory (the CPU, several ranks sharing a device).
enum class Backend { Default, Gloo, Nccl };  // Default: NCCL (or its twin) on a device, Gloo on the CPU

// Whether the device groups of a run on `device` with `backend` use NCCL, or sim's NCCL twin: then
// each rank needs a device of its own, and its collectives take device tensors only.
FSDPX_API bool nccl_collectives(DeviceKind device, Backend backend);

// Refuses a device that cannot be opened for `local_ranks` ranks of this node (its library, no
// device visible, more ranks than devices with NCCL unless `share_devices`: device.h's
// check_device). fsdpx-train checks before it launches workers, each rank again. Throws
// fsdpx::Error naming the way out.
FSDPX_API void check_device_trains(DeviceKind device, Backend backend, int local_ranks, bool share_devices);

struct RuntimeOptions {
  Topology topology;
  DeviceKind device = DeviceKind::Cpu;
  Backend backend = Backend::Default;
  std::chrono::milliseconds rendezvous_timeout{60000};
  std::chrono::milliseconds collective_timeout{300000};
  // When another rank reports a failure (report_failure), end this process within about a
  // second with that rank's message, instead of waiting in a collective until the timeout.
  // fsdpx-train sets it; a program embedding fsdpx decides for itself.
  bool exit_on_peer_failure = false;
  // Debug mode: before each collective the ranks of its group compare what they are about to
  // call (op, dtype, element count, unit, phase) through one small all-gather, and a mismatch is
  // an error naming both calls before anything hangs. Costs a round trip per collective.
  bool check_collectives = false;
  // Each rank watches the next one's heartbeat: a rank lost for PeerMonitor::kLostAfter (3 s) is
  // named by its watcher, which aborts its communicators; with exit_on_peer_failure every rank
  // ends with that message. On with NCCL (a collective waiting for a lost rank hangs on the
  // device instead of failing); the tests turn it on elsewhere to prove it.
  bool watch_peers = false;
  // With NCCL (or sim's twin), more ranks on a node than devices: the ranks go round-robin over
  // the devices, and each poses to NCCL as a node of its own (pose_as_nccl_node, c10d_backends.h)
  // so that NCCL takes ranks on one device. For tests and for checking a run on fewer devices
  // than its cluster has; the bytes go over sockets, so its speed is not a cluster's.
  bool share_devices = false;
};

// FSDPX_SHARE_GPUS=1: share_devices for a program that does not set it itself (fsdpx-train's
// --share-gpus, the library's RuntimeSettings::share_gpus); anything but 0 or 1 is refused.
FSDPX_API bool share_gpus_from_environment();

class FSDPX_API ProcessGroups {
 public:
  // Rendezvous through a c10d TCPStore at master_addr:master_port (rank 0 serves it): waits
  // until every rank has joined, then builds the world group. Throws fsdpx::Error naming the
  // ranks that did not join after rendezvous_timeout, naming the address if the master cannot be
  // reached within rendezvous_timeout, or at once if rank 0 cannot serve the port.
  static std::shared_ptr<ProcessGroups> create(const RuntimeOptions& options);
  ~ProcessGroups();

  const Topology& topology() const;
  DeviceKind device() const;
  // With ranks sharing devices over NCCL (RuntimeOptions::share_devices, more local ranks than
  // devices): the variables this rank set to pose as a node of its own ("NAME=VALUE ..."); else "".
  const std::string& nccl_pose() const;
  // Every rank, for tensors on the device: NCCL, or Gloo staged through host memory for a device.
  std::shared_ptr<Communicator> world() const;
  // Every rank, over Gloo, for scalars and metadata on the CPU (losses, counts, flags, checkpoint
  // sums): apart from the device groups in every configuration, so that a device group (NCCL)
  // never sees a CPU tensor and metadata never waits behind device collectives.
  std::shared_ptr<Communicator> control() const;

  // A group of `ranks` (global ranks, ascending). Every rank in it must call this, in the same
  // order relative to other group creations; the others must not. A new backend over a
  // PrefixStore of the rendezvous store.
  std::shared_ptr<Communicator> new_group(const std::string& name, const std::vector<int>& ranks);

  // Another group of every rank over Gloo on CPU tensors, as control() is, with connections of
  // its own: for a thread other than the one that issues the run's collectives (a background
  // checkpoint writer), whose collectives then never interleave with the run's on one group.
  // Every rank must call it, in the same order relative to other group creations.
  std::shared_ptr<Communicator> new_control_group(const std::string& name) const;

  // Hybrid sharding's groups: `shard` holds the shard_size consecutive ranks that include this
  // one (a node when shard_size = local world size); `replicate` holds the ranks with the same
  // index in every shard group. Every rank calls it. Throws fsdpx::Error if shard_size does not
  // divide the world size.
  struct Hybrid {
    std::shared_ptr<Communicator> shard;
    std::shared_ptr<Communicator> replicate;
  };
  Hybrid hybrid(int shard_size);

  // Tells the other ranks, through the rendezvous store, that this rank failed with `message`:
  // their collective errors name it at once (and with exit_on_peer_failure they end). Never throws.
  void report_failure(const std::string& message) const;

 private:
  struct Impl;
  explicit ProcessGroups(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdpx
