// Device memory of the sim backend: allocator, host-access scopes,
// statistics, memory budget, and storage resize.
//
// Protection schemes (env FSDPX_SIM_PROTECT, read once):
//
//  alias (default) -- every allocation is a memfd mapped twice:
//      dev  = mmap(PROT_NONE,  MAP_SHARED)  -> the data_ptr torch sees
//      host = mmap(PROT_RW,    MAP_SHARED)  -> private alias for our kernels
//    Host code that dereferences a data_ptr always faults, on every thread,
//    at every moment; our kernels translate dev->host through the registry.
//    Cost: ~5 syscalls per allocation (memfd_create, ftruncate, 2 mmap,
//    close) and 2 munmap per free; zero syscalls per kernel. 2 VMAs per live
//    allocation (vm.max_map_count defaults to 65530 -> ~32k live blocks).
//
//  none -- plain RW memory, data_ptr == host pointer, no detection.
//
// fork(): alias-mode blocks are MAP_SHARED, so a forked child shares device
// memory with its parent (a child's write is seen by the parent). CUDA
// forbids using the device after fork altogether; fsdpx launches ranks with
// fork+exec.
//
// Every sim allocation is its own mapping, rounded up to whole pages:
// "allocated" counts the bytes asked, "reserved" the bytes mapped, live or
// cached. Freed blocks are cached for exact-size reuse (FSDPX_SIM_CACHE=1,
// default; 0 unmaps at free): this avoids mmap + page faults for the
// repeated same-size buffers of a training loop, and makes reserved >=
// allocated as with CUDA. It is NOT CUDA's caching allocator: no 512-byte
// rounding, no 2 MiB/20 MiB segments, no block splitting, no per-stream
// pools, so reserved/fragmentation numbers differ from CUDA's. When a
// budget is set and the next mapping would exceed it, the cache is
// released and the allocation retried (num_alloc_retries), like CUDA.
#include "fsdpx/sim/sim.h"
#include "sim_order.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <string>

namespace fsdpx::sim {

namespace {

using c10::CachingDeviceAllocator::DeviceStats;
constexpr size_t kAgg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

Protection read_protection() {
  const char* env = std::getenv("FSDPX_SIM_PROTECT");
  if (env == nullptr || std::strcmp(env, "alias") == 0) return Protection::Alias;
  if (std::strcmp(env, "none") == 0) return Protection::None;
  TORCH_CHECK(false, "FSDPX_SIM_PROTECT must be alias or none; got ", env);
}

bool env_flag(const char* name, bool dflt) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == 0) return dflt;
  return !(std::strcmp(env, "0") == 0 || std::strcmp(env, "false") == 0);
}

// FSDPX_SIM_CACHE (default 1): keep freed blocks for reuse, like CUDA's
// caching allocator (reserved >= allocated; empty_cache() releases).
bool cache_enabled() {
  static const bool on = env_flag("FSDPX_SIM_CACHE", true);
  return on;
}

// FSDPX_SIM_MEMORY: bytes, or a whole number with KiB, MiB, GiB or TiB (K, M, G, T alike: powers of
// 1024); unset or empty, no budget. Anything else is an error naming the value.
size_t read_budget() {
  const char* env = std::getenv("FSDPX_SIM_MEMORY");
  if (env == nullptr || *env == 0) return 0;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(env, &end, 10);
  const std::string unit(end);
  size_t shift = 0;
  if (unit == "K" || unit == "KiB") shift = 10;
  else if (unit == "M" || unit == "MiB") shift = 20;
  else if (unit == "G" || unit == "GiB") shift = 30;
  else if (unit == "T" || unit == "TiB") shift = 40;
  TORCH_CHECK(end != env && errno == 0 && *env != '-' && (unit.empty() || shift != 0) && (n >> (63 - shift)) == 0,
              "sim: FSDPX_SIM_MEMORY='", env, "' is not a size: give bytes, or a whole number with KiB, MiB, GiB "
              "or TiB (e.g. 64MiB)");
  return static_cast<size_t>(n) << shift;
}

std::string human(size_t b) {
  char buf[64];
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) { v /= 1024; ++u; }
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, unit[u]);
  return buf;
}

struct Block {
  char* dev = nullptr;     // address handed to torch (PROT_NONE unless "none")
  char* host = nullptr;    // address our kernels use (== dev unless "alias")
  size_t nbytes = 0;       // asked
  size_t mapped = 0;       // page-rounded
  c10::DeviceIndex device = 0;
};

struct PerDevice {
  std::mutex mu;
  DeviceStats stats;
  size_t budget = 0;       // 0 = unlimited
  // Free blocks kept mapped for reuse, keyed by mapped size (exact-size
  // reuse only: no splitting, unlike CUDA's caching allocator).
  std::multimap<size_t, Block> cache;
  size_t cached_bytes = 0;
};

// Global registry of live allocations, keyed by device base address.
// Readers (host() lookups) take it shared; alloc/free take it exclusive.
struct Registry {
  std::shared_mutex mu;
  std::map<uintptr_t, Block> blocks;

  // Block containing p, or nullptr. Caller holds mu.
  Block* find(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return nullptr;
    --it;
    Block& b = it->second;
    return (a >= it->first && a < it->first + b.mapped) ? &b : nullptr;
  }
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: frees may run at exit
  return *r;
}

std::array<PerDevice, kMaxDevices>& devices() {
  static auto* d = [] {
    auto* a = new std::array<PerDevice, kMaxDevices>();
    const size_t b = read_budget();
    for (auto& pd : *a) pd.budget = b;
    return a;
  }();
  return *d;
}

void check_sys(bool ok, const char* what, size_t bytes) {
  TORCH_CHECK(ok, "sim: ", what, " failed for ", bytes, " bytes: ", std::strerror(errno));
}

// Map `mapped` bytes according to the protection mode.
void map_block(Block& b) {
  const size_t n = b.mapped;
  switch (protection_mode()) {
    case Protection::Alias: {
      const int fd = memfd_create("fsdpx-sim", MFD_CLOEXEC);
      check_sys(fd >= 0, "memfd_create", n);
      if (ftruncate(fd, static_cast<off_t>(n)) != 0) {
        const int e = errno;
        close(fd);
        errno = e;
        check_sys(false, "ftruncate", n);
      }
      void* dev = mmap(nullptr, n, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
      void* host = dev == MAP_FAILED
          ? MAP_FAILED
          : mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      const int e = errno;
      close(fd);  // the mappings keep the memory alive
      if (host == MAP_FAILED) {
        if (dev != MAP_FAILED) munmap(dev, n);
        errno = e;
        check_sys(false, "mmap", n);
      }
      b.dev = static_cast<char*>(dev);
      b.host = static_cast<char*>(host);
      return;
    }
    case Protection::None: {
      void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      check_sys(p != MAP_FAILED, "mmap", n);
      b.dev = b.host = static_cast<char*>(p);
      return;
    }
  }
}

void unmap_block(const Block& b) {
  munmap(b.dev, b.mapped);
  if (b.host != b.dev) munmap(b.host, b.mapped);
}

void sim_free(void* ptr);

// Unmap every cached (free) block of one device. Caller holds pd.mu.
size_t release_cache_locked(PerDevice& pd) {
  size_t released = 0;
  for (auto& kv : pd.cache) {
    unmap_block(kv.second);
    pd.stats.reserved_bytes[kAgg].decrease(kv.second.mapped);
    pd.stats.segment[kAgg].decrease(1);
    released += kv.second.mapped;
  }
  pd.cache.clear();
  pd.cached_bytes = 0;
  return released;
}

[[noreturn]] void throw_oom(PerDevice& pd, c10::Device dev, size_t nbytes, size_t mapped) {
  pd.stats.num_ooms++;
  const size_t used = static_cast<size_t>(pd.stats.reserved_bytes[kAgg].current);
  const size_t left = pd.budget > used ? pd.budget - used : 0;
  std::ostringstream msg;
  msg << "sim out of memory on " << dev << ": tried to allocate " << human(nbytes) << " ("
      << nbytes << " bytes, " << mapped << " with page rounding); budget " << human(pd.budget)
      << " (" << pd.budget << " bytes, FSDPX_SIM_MEMORY), "
      << human(static_cast<size_t>(pd.stats.allocated_bytes[kAgg].current))
      << " allocated by " << pd.stats.allocation[kAgg].current << " live allocations, "
      << human(used) << " reserved, " << human(left) << " (" << left << " bytes) left.";
  TORCH_CHECK_WITH(OutOfMemoryError, false, msg.str());
}

// CUDA's caching allocator has no per-device state until the device type is initialised: its
// statistics before then are refused (CUDACachingAllocator's assertValidDevice). sim refuses alike,
// so that a path reading them before anything initialised the device fails here, not first on a GPU.
std::atomic<bool> g_initialised{false};

void check_initialised(c10::DeviceIndex i) {
  TORCH_CHECK(g_initialised.load(), "Invalid device argument ", static_cast<int>(i),
              ": did you call init? (sim, as CUDA's caching allocator: no statistics before the device type is "
              "initialised by at::globalContext().lazyInitDevice or a first allocation)");
}

class SimDeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    note_initialised();
    const c10::DeviceIndex idx = current_device();
    const c10::Device dev = device(idx);
    if (nbytes == 0) return c10::DataPtr(nullptr, nullptr, &sim_free, dev);

    const size_t mapped = (nbytes + page_size() - 1) / page_size() * page_size();
    PerDevice& pd = devices()[idx];
    Block b;
    {
      // Everything under the device mutex, mapping included: keeps the
      // budget exact under concurrent allocation (a few us of syscalls).
      std::lock_guard<std::mutex> g(pd.mu);
      auto hit = pd.cache.find(mapped);
      if (hit != pd.cache.end()) {  // reuse a cached block of the same size
        b = hit->second;
        pd.cache.erase(hit);
        pd.cached_bytes -= mapped;
      } else {
        const auto used = [&] {
          return static_cast<size_t>(pd.stats.reserved_bytes[kAgg].current);
        };
        if (pd.budget != 0 && used() + mapped > pd.budget) {
          // Like CUDA: free the cache and retry before giving up.
          pd.stats.num_alloc_retries++;
          release_cache_locked(pd);
          if (used() + mapped > pd.budget) throw_oom(pd, dev, nbytes, mapped);
        }
        b.mapped = mapped;
        b.device = idx;
        map_block(b);  // throws on mmap failure; nothing accounted yet
        pd.stats.reserved_bytes[kAgg].increase(mapped);
        pd.stats.segment[kAgg].increase(1);
        pd.stats.num_device_alloc++;
      }
      b.nbytes = nbytes;
      pd.stats.allocated_bytes[kAgg].increase(nbytes);
      pd.stats.requested_bytes[kAgg].increase(nbytes);
      pd.stats.active_bytes[kAgg].increase(nbytes);
      pd.stats.allocation[kAgg].increase(1);
      pd.stats.active[kAgg].increase(1);
    }
    {
      std::unique_lock<std::shared_mutex> g(registry().mu);
      registry().blocks.emplace(reinterpret_cast<uintptr_t>(b.dev), b);
    }
    order_allocated(b.dev, idx, nbytes);
    if (poison_enabled()) {  // NaN for floats, -1 for ints: catches reads of
      DeviceAccess acc;      // never-written memory deterministically
      std::memset(acc.host(b.dev), 0xFF, nbytes);
    }
    return c10::DataPtr(b.dev, b.dev, &sim_free, dev);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &sim_free; }

  // Device-to-device memcpy (used e.g. by Storage/clone paths in torch).
  void copy_data(void* dst, const void* src, std::size_t n) const override {
    if (n == 0) return;
    DeviceAccess acc;
    std::memcpy(acc.host(dst), acc.host(src), n);
  }

  bool initialized() override { return g_initialised.load(); }
  void emptyCache(c10::MempoolId_t) override { empty_cache(); }
  // Nothing is ever reused while a stream could still use it: frees are
  // immediate and all work is complete at issue time.
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    order_stream_recorded(ptr.get(), stream);  // the stream-order check's record of it
  }
  DeviceStats getDeviceStats(c10::DeviceIndex i) override {
    check_initialised(i);
    return device_stats(i);
  }
  void resetAccumulatedStats(c10::DeviceIndex i) override {
    check_initialised(i);
    reset_accumulated_stats(i);
  }
  void resetPeakStats(c10::DeviceIndex i) override {
    check_initialised(i);
    reset_peak_stats(i);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex i) override {
    check_initialised(i);
    PerDevice& pd = devices()[i < 0 ? current_device() : i];
    std::lock_guard<std::mutex> g(pd.mu);
    const size_t used = static_cast<size_t>(pd.stats.reserved_bytes[kAgg].current);
    const size_t total = pd.budget ? pd.budget : size_t(sysconf(_SC_PHYS_PAGES)) * page_size();
    return {total > used ? total - used : 0, total};
  }
};

SimDeviceAllocator g_allocator;

void sim_free(void* ptr) {
  if (ptr == nullptr) return;
  Block b;
  {
    std::unique_lock<std::shared_mutex> g(registry().mu);
    auto it = registry().blocks.find(reinterpret_cast<uintptr_t>(ptr));
    TORCH_INTERNAL_ASSERT(it != registry().blocks.end(), "sim: free of unknown pointer ", ptr);
    b = it->second;
    registry().blocks.erase(it);
  }
  order_freed(b.dev);
  PerDevice& pd = devices()[b.device];
  std::lock_guard<std::mutex> g(pd.mu);
  pd.stats.allocated_bytes[kAgg].decrease(b.nbytes);
  pd.stats.requested_bytes[kAgg].decrease(b.nbytes);
  pd.stats.active_bytes[kAgg].decrease(b.nbytes);
  pd.stats.allocation[kAgg].decrease(1);
  pd.stats.active[kAgg].decrease(1);
  if (cache_enabled()) {
    pd.cache.emplace(b.mapped, b);
    pd.cached_bytes += b.mapped;
  } else {
    unmap_block(b);
    pd.stats.reserved_bytes[kAgg].decrease(b.mapped);
    pd.stats.segment[kAgg].decrease(1);
    pd.stats.num_device_free++;
  }
}

}  // namespace

// FSDPX_SIM_POISON (default 0): fill every new allocation with 0xFF.
bool poison_enabled() {
  static const bool on = env_flag("FSDPX_SIM_POISON", false);
  return on;
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator)

Protection protection_mode() {
  static const Protection p = read_protection();
  return p;
}

c10::DeviceAllocator* allocator() { return &g_allocator; }
void note_initialised() {  // on every allocation: a load, and a store once
  if (!g_initialised.load(std::memory_order_relaxed)) g_initialised.store(true);
}
bool caching_enabled() { return cache_enabled(); }

size_t empty_cache() {
  size_t released = 0;
  for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
    PerDevice& pd = devices()[i];
    std::lock_guard<std::mutex> g(pd.mu);
    const size_t blocks = pd.cache.size();
    released += release_cache_locked(pd);
    pd.stats.num_device_free += static_cast<int64_t>(blocks);
  }
  return released;
}

size_t memory_budget(c10::DeviceIndex i) {
  PerDevice& pd = devices()[i < 0 ? current_device() : i];
  std::lock_guard<std::mutex> g(pd.mu);
  return pd.budget;
}
void set_memory_budget(c10::DeviceIndex i, size_t bytes) {
  PerDevice& pd = devices()[i < 0 ? current_device() : i];
  std::lock_guard<std::mutex> g(pd.mu);
  pd.budget = bytes;
}

DeviceStats device_stats(c10::DeviceIndex i) {
  PerDevice& pd = devices()[i < 0 ? current_device() : i];
  std::lock_guard<std::mutex> g(pd.mu);
  return pd.stats;
}
void reset_peak_stats(c10::DeviceIndex i) {
  PerDevice& pd = devices()[i < 0 ? current_device() : i];
  std::lock_guard<std::mutex> g(pd.mu);
  auto& s = pd.stats;
  for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                    &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                    &s.inactive_split_bytes, &s.requested_bytes})
    for (auto& st : *arr) st.reset_peak();
}
void reset_accumulated_stats(c10::DeviceIndex i) {
  PerDevice& pd = devices()[i < 0 ? current_device() : i];
  std::lock_guard<std::mutex> g(pd.mu);
  auto& s = pd.stats;
  for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                    &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                    &s.inactive_split_bytes, &s.requested_bytes})
    for (auto& st : *arr) st.reset_accumulated();
  s.num_alloc_retries = s.num_ooms = s.num_sync_all_streams = 0;
  s.num_device_alloc = s.num_device_free = 0;
}

size_t live_allocations() {
  std::shared_lock<std::shared_mutex> g(registry().mu);
  return registry().blocks.size();
}

bool is_device_ptr(const void* p, c10::DeviceIndex* index) {
  std::shared_lock<std::shared_mutex> g(registry().mu);
  const Block* b = registry().find(p);
  if (b && index) *index = b->device;
  return b != nullptr;
}

// ------------------------------------------------------------ DeviceAccess --
void* DeviceAccess::host(const void* p) {
  if (p == nullptr) return nullptr;
  const Protection mode = protection_mode();
  if (mode == Protection::None) return const_cast<void*>(p);
  const char* dev = nullptr;
  char* host = nullptr;
  c10::DeviceIndex index = 0;
  {
    std::shared_lock<std::shared_mutex> g(registry().mu);
    const Block* b = registry().find(p);
    TORCH_CHECK(b, "sim: ", p, " is not a live sim device address");
    dev = b->dev;
    host = b->host;
    index = b->device;
  }
  order_touched(dev, index);  // a kernel of the current stream uses the block
  return host + (static_cast<const char*>(p) - dev);
}

// DeviceAccess::host_alias is defined in sim_ops.cpp (needs TensorImpl).

// --------------------------------------------------------- resize_bytes_sim --
void resize_bytes_sim(c10::StorageImpl* storage, size_t nbytes, bool copy_old) {
  TORCH_CHECK(storage->resizable(), "sim: trying to resize a storage that is not resizable");
  TORCH_CHECK(storage->device_type() == c10::DeviceType::PrivateUse1,
              "sim: resize_bytes_sim on a ", storage->device(), " storage");
  c10::Allocator* alloc = storage->allocator();
  TORCH_CHECK(alloc != nullptr, "sim: storage has no allocator");
  // Allocate on the storage's device, not the current one.
  c10::OptionalDeviceGuard guard;
  if (storage->device().has_index()) guard.reset_device(storage->device());
  // allocate(0) still yields a DataPtr that carries the sim device; a
  // default-constructed DataPtr would silently turn the storage into a CPU
  // storage (DataPtr's default device is CPU).
  at::DataPtr fresh = alloc->allocate(nbytes);
  const size_t keep = std::min(nbytes, storage->nbytes());
  if (copy_old && keep != 0 && storage->data() != nullptr) {
    DeviceAccess acc;
    std::memcpy(acc.host(fresh.get()), acc.host(storage->data()), keep);
  }
  // set_data_ptr_noswap drops the old DataPtr -> sim_free -> stats go down.
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

}  // namespace fsdpx::sim
