#include "fsdpx/framework/runtime/memory_accounting.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include <ATen/native/Resize.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/alloc_cpu.h>

#include "cpu_block_cache.h"

namespace fsdpx {
namespace {

std::atomic<int64_t> g_allocated{0}, g_peak{0}, g_reserved_peak{0};
// The bytes of blocks outside the block cache (smaller than CpuBlockCache::kMinBlock, or every
// block with the cache off), with their headers: with the cache's segments, what is reserved.
std::atomic<int64_t> g_uncached{0};
std::atomic<bool> g_installed{false};

// Each block carries, in a header of one alignment unit before the bytes handed out, the bytes
// asked, its cache block (or null) and its own size, so that the deleter needs no table: the data
// pointer is its own context (raw_allocate works).
constexpr size_t kHeader = 64;  // c10's CPU alignment: the bytes after it stay aligned as alloc_cpu's
struct Header {
  int64_t asked;
  void* cached;  // CpuBlockCache's block, or null
  int64_t bytes;  // of the block, header included
};
static_assert(sizeof(Header) <= kHeader, "the header fits its alignment unit");

void raise(std::atomic<int64_t>& peak_of, int64_t now) {
  int64_t peak = peak_of.load(std::memory_order_relaxed);
  while (now > peak && !peak_of.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// The block cache (cpu_block_cache.h) keeps the blocks of 1 MiB and more a step frees, and hands
// their bytes out again to later requests of any size: a training step allocates about the same
// every step, and without the cache each block would go back to the system (fsdpx-train makes
// glibc unmap blocks of 1 MiB and more at once, so that RSS follows what is allocated) and have its
// pages faulted in again the next step. trim_cpu_block_cache() releases the segments that no
// request used since the trim before. FSDPX_CPU_BLOCK_CACHE=0 turns the cache off: every block goes
// back at once.
bool cache_on() {
  static const bool on = [] {
    const char* env = std::getenv("FSDPX_CPU_BLOCK_CACHE");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}

int64_t reserved_now() { return cpu_block_cache().resident_bytes() + g_uncached.load(std::memory_order_relaxed); }

void counted_free(void* data) {
  if (!data) return;
  char* base = static_cast<char*>(data) - kHeader;
  Header h;
  std::memcpy(&h, base, sizeof h);
  g_allocated.fetch_sub(h.asked, std::memory_order_relaxed);
  if (h.cached) {
    cpu_block_cache().give_back(h.cached);
    return;
  }
  g_uncached.fetch_sub(h.bytes, std::memory_order_relaxed);
  c10::free_cpu(base);
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &counted_free, c10::Device(c10::DeviceType::CPU)};
    Header h{static_cast<int64_t>(n), nullptr, static_cast<int64_t>(n + kHeader)};
    char* base;
    if (n + kHeader >= CpuBlockCache::kMinBlock && cache_on()) {
      const CpuBlockCache::Taken t = cpu_block_cache().take(n + kHeader);
      base = t.base;
      h.cached = t.block;
      h.bytes = static_cast<int64_t>(t.bytes);
    } else {
      base = static_cast<char*>(c10::alloc_cpu(n + kHeader));  // throws c10::Error when out of memory
      g_uncached.fetch_add(h.bytes, std::memory_order_relaxed);
    }
    std::memcpy(base, &h, sizeof h);
    raise(g_peak, g_allocated.fetch_add(h.asked, std::memory_order_relaxed) + h.asked);
    raise(g_reserved_peak, reserved_now());
    void* data = base + kHeader;
    return {data, data, &counted_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

// "key value" lines of a /proc or cgroup file: the value of `key` in bytes (kB scaled), or -1.
int64_t field_of(const std::string& path, const std::string& key, int64_t scale = 1) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string k;
    int64_t v = 0;
    if (ls >> k && (k == key || k == key + ":") && ls >> v) return v * scale;
  }
  return -1;
}

int64_t number_in(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return -1;
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    return -1;
  }
}

// This process's memory cgroup: what is left under its limit (limit - usage + reclaimable page
// cache), or -1 without a limit. `where` gets the cgroup's path.
int64_t cgroup_left(std::string& where) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    // "N:controllers:/path"; v2 is "0::/path", v1's memory controller "N:memory:/path".
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::string dir, limit_file, usage_file, cache_key;
    if (controllers.empty()) {
      dir = "/sys/fs/cgroup" + path;
      limit_file = dir + "/memory.max", usage_file = dir + "/memory.current", cache_key = "file";
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      dir = "/sys/fs/cgroup/memory" + path;
      limit_file = dir + "/memory.limit_in_bytes", usage_file = dir + "/memory.usage_in_bytes",
      cache_key = "total_cache";
    } else {
      continue;
    }
    const int64_t limit = number_in(limit_file);
    if (limit < 0 || limit >= (int64_t{1} << 60)) continue;  // no limit ("max", or v1's huge number)
    const int64_t usage = number_in(usage_file),
                  cache = std::max<int64_t>(0, field_of(dir + "/memory.stat", cache_key));
    where = dir;
    return std::max<int64_t>(0, limit - std::max<int64_t>(0, usage - cache));
  }
  return -1;
}

}  // namespace

void install_cpu_memory_accounting() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingCpuAllocator allocator;  // never destroyed before the tensors it allocated
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
    g_installed.store(true);
  });
}

bool cpu_memory_accounting_installed() { return g_installed.load(); }

MemoryStats cpu_memory_stats() {
  MemoryStats s;
  s.allocated = g_allocated.load(std::memory_order_relaxed);
  s.reserved = std::max(s.allocated, reserved_now());
  s.peak_allocated = std::max(s.allocated, g_peak.load(std::memory_order_relaxed));
  s.peak_reserved = std::max({s.reserved, s.peak_allocated, g_reserved_peak.load(std::memory_order_relaxed)});
  return s;
}

void reset_cpu_peak_memory() {
  const MemoryStats s = cpu_memory_stats();
  g_peak.store(s.allocated, std::memory_order_relaxed);
  g_reserved_peak.store(s.reserved, std::memory_order_relaxed);
}

int64_t trim_cpu_block_cache() { return cpu_block_cache().trim(); }

void resize_storage_bytes(const c10::Storage& storage, size_t bytes) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (storage.device().is_cpu()) {
    at::native::resize_bytes_cpu(impl, bytes);
    return;
  }
  // A device: a fresh block of the storage's own allocator (none for 0 bytes) replaces the old,
  // which goes back to the allocator (CUDA's reuses it in stream order). Contents are not kept.
  if (impl->nbytes() == bytes) return;
  TORCH_CHECK(impl->resizable() && impl->allocator(), "resize_storage_bytes: the storage on ", storage.device(),
              " is not resizable");
  c10::OptionalDeviceGuard guard(storage.device());
  impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
  impl->set_nbytes(bytes);
}

void free_now(at::Tensor& t) {
  if (!t.defined()) return;
  resize_storage_bytes(t.storage(), 0);
  t = at::Tensor();
}

int64_t resident_bytes() { return field_of("/proc/self/status", "VmRSS", 1024); }

AvailableMemory available_memory() {
  AvailableMemory a;
  a.bytes = field_of("/proc/meminfo", "MemAvailable", 1024);
  if (a.bytes >= 0) a.source = "MemAvailable";
  std::string where;
  const int64_t left = cgroup_left(where);
  if (left >= 0 && (a.bytes < 0 || left < a.bytes)) {
    a.bytes = left;
    a.source = "the memory cgroup " + where + " (its limit less its usage)";
  }
  return a;
}

}  // namespace fsdpx

// The same accounting for programs that load libfsdpx without its C++ headers (the FSDP2 side of
// benchmarks/vs_fsdp2 through ctypes), so that both sides of a comparison are measured alike.
extern "C" {
FSDPX_API void fsdpx_install_cpu_memory_accounting() { fsdpx::install_cpu_memory_accounting(); }
FSDPX_API int64_t fsdpx_cpu_allocated_bytes() { return fsdpx::cpu_memory_stats().allocated; }
FSDPX_API int64_t fsdpx_cpu_peak_allocated_bytes() { return fsdpx::cpu_memory_stats().peak_allocated; }
FSDPX_API void fsdpx_reset_cpu_peak_memory() { fsdpx::reset_cpu_peak_memory(); }
FSDPX_API int64_t fsdpx_trim_cpu_block_cache() { return fsdpx::trim_cpu_block_cache(); }
}
