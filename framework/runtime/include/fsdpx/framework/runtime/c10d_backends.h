// Makers of c10d backends: the real Gloo inside LibTorch (CPU) and ProcessGroupNCCL (CUDA).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "fsdpx/export.h"
#include "fsdpx/topology.h"

namespace fsdpx {

// sizeof(c10d::ProcessGroupGloo) in LibTorch 2.11.0; see gloo_backend.cpp.
constexpr size_t kGlooObjectBytes = 488;
constexpr const char* kGlooObjectBytesTorch = "2.11.0";  // the LibTorch it was read from

// Throws fsdpx::Error unless `build_config` (at::show_config()'s text, which names the running
// LibTorch's TORCH_VERSION) is LibTorch kGlooObjectBytesTorch: in any other the Gloo object
// may be larger than the memory make_gloo_backend gives it.
FSDPX_API void check_gloo_object_size_applies(const std::string& build_config);

// LibTorch's ProcessGroupGloo over `store` (rank, size within the group), with the default
// device (GLOO_SOCKET_IFNAME, else this host's address, else loopback) and `timeout` for every
// collective. The wheel ships no gloo headers, so the class is reached through its exported
// symbols (gloo_backend.cpp says how); throws fsdpx::Error naming the symbol if one is missing,
// or the version if the running LibTorch is not kGlooObjectBytesTorch.
FSDPX_API c10::intrusive_ptr<c10d::Backend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout);

// ProcessGroupNCCL over `store`, for CUDA device `device` (device_for_rank's: the local rank over the
// visible GPUs, round-robin when ranks share them; device 0 when the
// process sees a single GPU), which becomes current. Throws fsdpx::Error in a build without
// CUDA or when the device does not exist.
FSDPX_API c10::intrusive_ptr<c10d::Backend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, int device);

// Makes this rank a node of its own to NCCL, for ranks that share a device
// (RuntimeOptions::share_devices). NCCL refuses two ranks of one communicator on one device of
// one host ("Duplicate GPU detected"), and it knows a host by a hash of its name and boot id,
// which NCCL_HOSTID replaces: each local rank gets its own (the node's host id, or NCCL_HOSTID as
// set, and "/fsdpx-local-rank-N"), so NCCL puts every rank on a node of its own and moves the bytes
// through its network transport. On one node that is sockets on loopback: NCCL_SOCKET_IFNAME=lo
// and NCCL_IB_DISABLE=1, unless already set. NCCL reads them once per process, at its first
// communicator: call this before any (ProcessGroups::create does; sim's twin keeps the same rule).
// Returns what it set, as "NAME=VALUE" words.
FSDPX_API std::string pose_as_nccl_node(const Topology& topology);

// sim's NCCL twin (devices/sim, fsdpx/sim/sim_nccl.h) over `host`, a Gloo backend of the same
// ranks, for the sim device of local rank `local_rank` (device_for_rank's rule). Loads
// libfsdpx_sim.so; throws fsdpx::Error when it does not load or has no twin.
FSDPX_API c10::intrusive_ptr<c10d::Backend> make_sim_nccl_twin(c10::intrusive_ptr<c10d::Backend> host,
                                                               int local_rank);

}  // namespace fsdpx
