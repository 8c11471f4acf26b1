// fsdpx_sim: a simulated accelerator "sim" registered as PrivateUse1.
//
// Public API of libfsdpx_sim.so. Loading the library (linking it with
// --no-as-needed, or dlopen) is enough to register the backend: every
// registration below happens in static initialisers.
//
// Model in one paragraph: a "sim" device is host RAM that host code must not
// touch. Device allocations are page-aligned shared-memory mappings whose
// address (the tensor's data_ptr) is PROT_NONE, so any host dereference of a
// device pointer raises SIGSEGV. The device's own "kernels" (copies, fills,
// item(), and -- through the boxed CPU fallback -- every other ATen op) run
// synchronously on the calling host thread, in issue order, and reach device
// bytes only through a DeviceAccess scope (see below). Streams and events
// exist so that code written for CUDA runs unchanged, but since everything
// completes at issue time they impose no ordering of their own; the stream-order check (below)
// reports the orderings a GPU would need and code left out.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace at {
class Tensor;
}

// The library is built with hidden visibility, as all of fsdpx; its API is exported.
#define FSDPX_SIM_API __attribute__((visibility("default")))

namespace fsdpx::sim {

// ---------------------------------------------------------------- devices --
// Number of sim devices: env FSDPX_SIM_DEVICES (default 8, at most kMaxDevices).
inline constexpr int kMaxDevices = 64;
FSDPX_SIM_API c10::DeviceIndex device_count() noexcept;
FSDPX_SIM_API c10::DeviceIndex current_device() noexcept;     // thread-local, default 0
FSDPX_SIM_API void set_device(c10::DeviceIndex index);        // checked
inline c10::Device device(c10::DeviceIndex i = -1) {
  return c10::Device(c10::DeviceType::PrivateUse1, i < 0 ? current_device() : i);
}

// ---------------------------------------------------------------- streams --
// Stream ids are plain numbers: 0 is the default stream of each device;
// every other id is handed out by get_new_stream()/get_stream_from_pool() and
// never reused. No resources are attached to a stream.
FSDPX_SIM_API c10::Stream get_default_stream(c10::DeviceIndex index = -1);
FSDPX_SIM_API c10::Stream get_current_stream(c10::DeviceIndex index = -1);
FSDPX_SIM_API void set_current_stream(c10::Stream stream);   // thread-local per device
FSDPX_SIM_API c10::Stream get_new_stream(c10::DeviceIndex index = -1, int priority = 0);

// --------------------------------------------------------- device memory --
enum class Protection {
  Alias,  // default: PROT_NONE device view + private RW "kernel" view
  None,   // plain RW memory; no fault detection (fastest)
};
// From env FSDPX_SIM_PROTECT = alias | none (read once).
FSDPX_SIM_API Protection protection_mode();

// Per-device memory budget in bytes (env FSDPX_SIM_MEMORY, 0 = unlimited).
// set_memory_budget overrides the env at run time (tests).
FSDPX_SIM_API size_t memory_budget(c10::DeviceIndex index);
FSDPX_SIM_API void set_memory_budget(c10::DeviceIndex index, size_t bytes);

// Statistics in the same struct the CUDA caching allocator uses.
//   allocated_bytes: bytes asked by callers (like CUDA's "allocated")
//   reserved_bytes : bytes mapped (page-rounded), live + cached free blocks
//   requested_bytes: same as allocated_bytes (no rounding inside blocks)
//   allocation / segment: live allocation counts
//   num_ooms, num_device_alloc, num_device_free
FSDPX_SIM_API c10::CachingDeviceAllocator::DeviceStats device_stats(c10::DeviceIndex index);
FSDPX_SIM_API void reset_peak_stats(c10::DeviceIndex index);
FSDPX_SIM_API void reset_accumulated_stats(c10::DeviceIndex index);
FSDPX_SIM_API size_t live_allocations();  // all devices
// Unmap all cached free blocks (FSDPX_SIM_CACHE=1, the default); returns
// bytes released. Also reachable as allocator()->emptyCache().
FSDPX_SIM_API size_t empty_cache();
FSDPX_SIM_API bool caching_enabled();  // env FSDPX_SIM_CACHE (default 1)
FSDPX_SIM_API bool poison_enabled();   // env FSDPX_SIM_POISON (default 0): new blocks = 0xFF

// The allocator registered for PrivateUse1 (also returned by
// c10::GetAllocator(kPrivateUse1) and at::getDeviceAllocator(kPrivateUse1)).
// Like CUDA's caching allocator, it exists only once the device type is initialised
// (at::globalContext().lazyInitDevice, which the first tensor's factory calls on CUDA, or the
// first allocation): before then its statistics and memory info through the c10 interface are a
// c10::Error ("Invalid device argument ...: did you call init?"), as CUDA's are. The functions
// above read them at any time.
FSDPX_SIM_API c10::DeviceAllocator* allocator();
FSDPX_SIM_API void note_initialised();  // what the hooks' init() and the first allocation do

// The stream-order check (src/sim_order.h; on unless FSDPX_SIM_STREAM_CHECK=0): a kernel on one
// stream touching memory another stream used last with no event waited on between, or memory
// freed while a stream other than its allocation's may still use it, is an error (c10::Error)
// naming the streams: on a GPU it would race. The hazards seen so far in this process, and the
// first one's message.
FSDPX_SIM_API size_t stream_hazards();
FSDPX_SIM_API std::string first_stream_hazard();
// A line per stream that did work ("sim:0 stream 3 uses 120": its kernels' touches of device
// memory), then "hazards N". Also extern "C" fsdpx_sim_stream_report(), for code that dlopens sim.
FSDPX_SIM_API std::string stream_report();

// Is `p` inside a live sim allocation? If so, which device.
FSDPX_SIM_API bool is_device_ptr(const void* p, c10::DeviceIndex* index = nullptr);

// Scoped host access to device memory: the only sanctioned way for the
// device's own kernels to touch device bytes. host(p) maps a device address
// (any interior pointer of a live allocation) to an address the host may
// read and write until the scope ends: in Alias mode the private RW alias of
// the same physical pages (no syscall), in None mode p itself. host(nullptr)
// returns nullptr (zero-size tensors).
class FSDPX_SIM_API DeviceAccess {
 public:
  DeviceAccess() = default;
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
  void* host(const void* device_ptr);
  // A CPU tensor aliasing `t`'s bytes (same sizes/strides/dtype); valid
  // while this scope lives. `t` must be a sim tensor.
  at::Tensor host_alias(const at::Tensor& t);
};

// ---------------------------------------------------------------- storage --
// Free or regrow a sim storage in place (the sim equivalent of
// at::native::resize_bytes_cpu / resize_bytes_cuda): allocates nbytes from
// the storage's allocator (nothing when 0), copies min(old, new) bytes on the
// device, swaps the DataPtr and sets nbytes. The StorageImpl object, and so
// every tensor viewing it, stays the same. Requires storage->resizable().
// With copy_old == false the old contents are dropped (FSDP "free then
// all-gather into it again" does not need them).
FSDPX_SIM_API void resize_bytes_sim(c10::StorageImpl* storage, size_t nbytes, bool copy_old = true);

// ----------------------------------------------------------- pinned host --
// Host allocator returned by the hooks' getPinnedMemoryAllocator(): blocks of
// LibTorch's CPU allocator (so that a counting CPU allocator counts them),
// recorded so that isPinnedPtr() answers true for any pointer inside one.
FSDPX_SIM_API c10::Allocator* pinned_allocator();
FSDPX_SIM_API bool is_pinned_ptr(const void* p);
struct PinnedStats {
  int64_t current_bytes, peak_bytes, total_allocs, live_blocks;
};
FSDPX_SIM_API PinnedStats pinned_stats();
FSDPX_SIM_API void reset_pinned_peak();

// -------------------------------------------------------------- generator --
// Default generator of a sim device (what the hooks' getDefaultGenerator
// returns). It is a thin wrapper over a private CPU (mt19937) generator; the
// fallback hands that CPU twin to CPU kernels, so seeding a sim device and a
// CPU generator alike yields bit-identical random streams.
FSDPX_SIM_API const at::Generator& default_generator(c10::DeviceIndex index = -1);
FSDPX_SIM_API at::Generator new_generator(c10::DeviceIndex index = -1);
// The CPU generator a sim generator forwards to (used by the fallback).
FSDPX_SIM_API at::Generator cpu_twin(const at::Generator& sim_generator);

}  // namespace fsdpx::sim
