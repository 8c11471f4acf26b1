// sim's NCCL twin: a c10d backend for sim tensors that keeps NCCL's rules, so that code written for
// ProcessGroupNCCL is held to them on every CI run without a GPU. The bytes move through a Gloo
// backend over the same ranks, on host copies; what the twin adds is NCCL's contract:
//   - device tensors only: every tensor must be a dense, contiguous sim tensor of the device the
//     backend was made for. A host tensor or another device's is refused at issue with
//     c10::ValueError, as ProcessGroupNCCL refuses ("Tensors must be CUDA and dense"), naming the
//     collective and the tensor;
//   - one rank per device of a host: when the twin is made, its ranks compare (host, device), the
//     host being NCCL_HOSTID or else its name and boot id as NCCL reads them, and two ranks on one
//     device of one host are a c10::DistBackendError on every rank, with NCCL's "Duplicate GPU
//     detected" (fsdpx's --share-gpus gives each rank a host id of its own, as for NCCL);
//   - ranks must agree: each collective first compares its kind, dtype, element counts, reduce op
//     and root across the group; a difference is a c10::DistBackendError from wait() on every
//     rank, naming each rank's call (NCCL itself would hang or corrupt memory);
//   - streams: a collective runs on the backend's own stream, which waits for the caller's
//     current stream at issue; it reads its input and writes its output there, as sim's
//     stream-order check sees it. It completes asynchronously (a worker thread per backend runs
//     the Gloo collectives in issue order), and wait() makes the waiting thread's current stream
//     depend on it (the host blocks until the bytes have arrived, which NCCL's host would not).
//     So a kernel touching a collective's buffers before a wait, or an output's bytes freed
//     before it (resize to 0: the Work holds the tensor, not its bytes), is a stream-order
//     hazard, as it would race on a GPU. Inputs are recorded on the collective's stream, as
//     ProcessGroupNCCL's recordStream does, so freeing one after issue is safe.
// Implemented: broadcast, allreduce (sum, avg, max), _allgather_base, _reduce_scatter_base (sum,
// avg, max; slices summed in rank order in fp32 or wider, as fsdpx's Gloo path does, so sim gives
// the CPU's bits), alltoall_base (even splits) and barrier. Anything else throws, naming it.
#pragma once

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#define FSDPX_SIM_NCCL_API __attribute__((visibility("default")))

namespace fsdpx::sim {

// The twin over `host` (a Gloo backend of the same rank and size, which it owns from now on), for
// tensors of sim device `device`. Its getBackendName() is kNcclTwinName.
FSDPX_SIM_NCCL_API c10::intrusive_ptr<c10d::Backend> make_nccl_twin(c10::intrusive_ptr<c10d::Backend> host,
                                                                    c10::DeviceIndex device);
constexpr const char* kNcclTwinName = "nccl (sim twin)";

}  // namespace fsdpx::sim

// For code that loads the library with dlopen (libfsdpx): make_nccl_twin by a C name. `host` is a
// c10d::Backend* carrying one reference, which the call takes; the result carries one reference
// for the caller (intrusive_ptr::reclaim). Throws as make_nccl_twin does.
extern "C" FSDPX_SIM_NCCL_API void* fsdpx_sim_make_nccl_twin(void* host, int device);
