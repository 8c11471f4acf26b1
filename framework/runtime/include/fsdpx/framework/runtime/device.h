// The device a rank computes on: the CPU, a CUDA GPU, or an accelerator registered as PrivateUse1
// (sim, devices/sim). What differs between devices is this thin layer: where each stream role
// runs, the allocator's statistics, freeing and regrowing a storage's bytes, host memory for
// copies, the generator's state, and synchronising. Everything else is LibTorch's device-generic
// API (c10::Stream, c10::Event, c10::DeviceGuard), which the engine uses as it is.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include "fsdpx/export.h"
#include "fsdpx/framework/runtime/memory_accounting.h"

namespace fsdpx {

// What each stream does (FSDP2's streams). On the CPU, and on a device whose kernels run in
// order, every role is the one stream there is.
enum class StreamRole { Compute, AllGatherCopyIn, AllGather, ReduceScatter, AllReduce, Offload };
constexpr int kStreamRoles = 6;
FSDPX_API const char* stream_role_name(StreamRole role);

class FSDPX_API DeviceRuntime {
 public:
  virtual ~DeviceRuntime();

  virtual c10::Device device() const = 0;  // with its index
  bool is_cpu() const { return device().is_cpu(); }
  // "cpu", "cuda:0", "sim:1"
  std::string name() const { return device().str(); }

  // The stream of `role`. Compute is the stream that was current when the runtime was opened.
  virtual c10::Stream stream(StreamRole role) const = 0;
  // `waiter`'s stream waits for the work issued so far on `done`'s (an event recorded on one and
  // waited on by the other); the host does not wait. Nothing on the CPU, or when both are one.
  virtual void wait_stream(StreamRole waiter, StreamRole done) const = 0;
  // Every role's stream waits for every other's: after an abandoned step, before its buffers go.
  void join_streams() const;

  // The device allocator's bytes, as CUDA's caching allocator counts them (on the CPU, the
  // counting allocator's: memory_accounting.h), and a restart of the peaks from now.
  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_peak_memory() const = 0;
  // Bytes the device can still hand out (the driver's free memory on CUDA, sim's budget less what
  // it reserved, the host's available memory on the CPU): what a probe may borrow.
  virtual int64_t free_memory() const = 0;

  // Frees (0) or regrows a storage of this device in place: the storage object, and every tensor
  // over it, stays. Its contents are not kept. The caller frees only what no stream still uses.
  virtual void resize_storage(const c10::Storage& storage, size_t bytes) const = 0;

  // Host memory from which copies to the device and back can run asynchronously: pinned where
  // the device has pinned memory, plain otherwise.
  virtual at::TensorOptions host_options() const = 0;

  // The state of the generator the device's random kernels draw from, and its restoration
  // (activation checkpointing replays a forward with the same random numbers).
  virtual at::Tensor rng_state() const = 0;
  virtual void set_rng_state(const at::Tensor& state) const = 0;

  // Waits for everything issued on the device (outside a step: timing, the peak probe).
  virtual void synchronize() const = 0;
};

// Makes `role`'s stream the calling thread's current stream while it lives (nothing on the CPU).
class FSDPX_API OnStream {
 public:
  OnStream(const DeviceRuntime& device, StreamRole role);

 private:
  c10::OptionalStreamGuard guard_;
};

// The device `spec` names ("cpu", "cuda", "sim") for the rank with local index `local_rank`:
// device local_rank of that type (modulo the devices visible: ranks sharing a device), with
// CUDA_VISIBLE_DEVICES respected (device 0 when a rank sees one GPU); for sim, after loading
// libfsdpx_sim.so from beside libfsdpx (or from FSDPX_SIM_LIBRARY), and for cuda after loading
// libfsdpx_cuda.so (or FSDPX_CUDA_LIBRARY), which loads LibTorch's CUDA libraries. Throws
// fsdpx::Error naming what is missing: an unknown name, no device visible, a library that does
// not load, a LibTorch that was asked about CUDA before that library loaded.
FSDPX_API std::shared_ptr<DeviceRuntime> open_device(const std::string& spec, int local_rank);
// The device open_device(spec, local_rank) opens, without opening it.
FSDPX_API c10::Device device_for_rank(const std::string& spec, int local_rank);

// The devices of `spec`'s type this process sees (CUDA_VISIBLE_DEVICES respected; sim's
// FSDPX_SIM_DEVICES); 1 for the CPU. Loads the device's library as open_device does.
FSDPX_API int visible_device_count(const std::string& spec);

// Checks that `spec` can be opened for `local_ranks` ranks on this node, without opening it
// (the launcher, before any worker starts): open_device's errors, and, when each rank needs a
// device of its own (NCCL without --share-gpus), more local ranks than devices, naming both
// numbers and the ways to share.
FSDPX_API void check_device(const std::string& spec, int local_ranks, bool one_device_per_rank);

}  // namespace fsdpx
