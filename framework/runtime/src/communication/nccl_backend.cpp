// ProcessGroupNCCL, which libfsdpx_cuda.so makes (devices/cuda: it links libtorch_cuda, where
// ProcessGroupNCCL lives); and sim's NCCL twin, which libfsdpx_sim.so makes.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/c10d_backends.h"
#include "fsdpx/framework/runtime/device.h"
#include "device_libraries.h"

namespace fsdpx {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, int device) {
  using Make = void* (*)(const void*, int, int, long long, int, const char**);
  const auto make = reinterpret_cast<Make>(cuda_function("fsdpx_cuda_make_nccl_backend"));
  const char* error = nullptr;
  void* backend = make(&store, rank, size, static_cast<long long>(timeout.count()), device, &error);
  if (!backend) throw Error(error ? error : "libfsdpx_cuda.so made no NCCL backend and did not say why");
  return c10::intrusive_ptr<c10d::Backend>::reclaim(static_cast<c10d::Backend*>(backend));
}

namespace {

// What NCCL names this host by when NCCL_HOSTID is unset: its host name and boot id.
std::string node_host_id() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return host + boot;
}

}  // namespace

std::string pose_as_nccl_node(const Topology& topology) {
  // The node's own id, read before the first call set this rank's: a second call (a second
  // Runtime in one process) sets the same value again.
  static const std::string node = [] {
    const char* set = std::getenv("NCCL_HOSTID");
    return set && *set ? std::string(set) : node_host_id();
  }();
  std::string said;
  auto set = [&](const char* name, const std::string& value, bool keep_users) {
    const char* was = std::getenv(name);
    if (keep_users && was) return;
    ::setenv(name, value.c_str(), 1);
    said += (said.empty() ? "" : " ") + std::string(name) + "=" + value;
  };
  set("NCCL_HOSTID", node + "/fsdpx-local-rank-" + std::to_string(topology.local_rank), false);
  if (topology.num_nodes == 1) {  // every peer is on this machine: loopback reaches them all
    set("NCCL_SOCKET_IFNAME", "lo", true);
    set("NCCL_IB_DISABLE", "1", true);
  }
  return said;
}

c10::intrusive_ptr<c10d::Backend> make_sim_nccl_twin(c10::intrusive_ptr<c10d::Backend> host, int local_rank) {
  load_sim();
  using MakeTwin = void* (*)(void*, int);
  static const auto make = reinterpret_cast<MakeTwin>(::dlsym(RTLD_DEFAULT, "fsdpx_sim_make_nccl_twin"));
  if (!make)
    throw Error("libfsdpx_sim.so has no NCCL twin (fsdpx_sim_make_nccl_twin): it is older than this libfsdpx; "
                "rebuild both (make build), or train with --backend gloo");
  const c10::Device device = device_for_rank("sim", local_rank);
  return c10::intrusive_ptr<c10d::Backend>::reclaim(
      static_cast<c10d::Backend*>(make(host.release(), static_cast<int>(device.index()))));
}

}  // namespace fsdpx
