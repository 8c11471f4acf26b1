#include "fsdpx/framework/runtime/memory_accounting.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include <ATen/native/Resize.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/alloc_cpu.h>

namespace fsdpx {
namespace {

std::atomic<int64_t> g_allocated{0}, g_peak{0}, g_reserved_peak{0};
std::atomic<bool> g_installed{false};

// Each block carries its size, and the size of the block under it, in a header of one alignment
// unit before the bytes handed out, so that the deleter needs no table: the data pointer is its
// own context (raw_allocate works).
constexpr size_t kHeader = 64;  // c10's CPU alignment: the bytes after it stay aligned as alloc_cpu's

void raise(std::atomic<int64_t>& peak_of, int64_t now) {
  int64_t peak = peak_of.load(std::memory_order_relaxed);
  while (now > peak && !peak_of.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// The block cache: blocks of kCachedFrom bytes and more are kept when freed, by size class, and
// handed out again for the same class. A training step allocates the same sizes every step;
// without the cache each would go back to the system (fsdpx-train makes glibc unmap blocks of
// 1 MiB and more at once, so that RSS follows what is allocated) and have its pages faulted in
// again the next step. trim_cpu_block_cache() frees the blocks not handed out again since the
// trim before: what a step stops using goes within two steps.
// FSDPX_CPU_BLOCK_CACHE=0 turns the cache off: every block goes back at once, as before it existed.
constexpr size_t kCachedFrom = size_t{1} << 20;

bool cache_on() {
  static const bool on = [] {
    const char* env = std::getenv("FSDPX_CPU_BLOCK_CACHE");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}

// The block size for `n` bytes with the header: below kCachedFrom exact; above, rounded up to an
// eighth of its power of two (at most 12.5% more), in MiB.
size_t block_bytes(size_t n) {
  n += kHeader;
  if (n < kCachedFrom) return n;
  size_t p = kCachedFrom;
  while (p <= n / 2) p *= 2;
  const size_t step = std::max(kCachedFrom, p / 8);
  return (n + step - 1) / step * step;
}

struct BlockCache {
  struct Kept {
    char* base;
    uint64_t epoch;  // the trim epoch it was kept in
  };
  std::mutex mu;
  std::unordered_map<size_t, std::vector<Kept>> free;  // by block size, last kept at the back
  int64_t cached = 0;
  uint64_t epoch = 0;
};

BlockCache& cache() {
  static auto* c = new BlockCache();  // leaked: blocks may be freed at exit
  return *c;
}

void counted_free(void* data) {
  if (!data) return;
  char* base = static_cast<char*>(data) - kHeader;
  int64_t header[2] = {0, 0};  // the bytes asked, the block's
  std::memcpy(header, base, sizeof header);
  g_allocated.fetch_sub(header[0], std::memory_order_relaxed);
  if (static_cast<size_t>(header[1]) < kCachedFrom || !cache_on()) {
    c10::free_cpu(base);
    return;
  }
  BlockCache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  c.free[static_cast<size_t>(header[1])].push_back(BlockCache::Kept{base, c.epoch});
  c.cached += header[1];
}

// A kept block of `block` bytes, or a new one.
char* take_block(size_t block) {
  if (block >= kCachedFrom) {
    BlockCache& c = cache();
    std::lock_guard<std::mutex> g(c.mu);
    auto it = c.free.find(block);
    if (it != c.free.end() && !it->second.empty()) {
      char* base = it->second.back().base;
      it->second.pop_back();
      c.cached -= static_cast<int64_t>(block);
      return base;
    }
  }
  return static_cast<char*>(c10::alloc_cpu(block));  // throws c10::Error when out of memory
}

int64_t cached_bytes() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  return c.cached;
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &counted_free, c10::Device(c10::DeviceType::CPU)};
    const size_t block = block_bytes(n);
    char* base = take_block(block);
    const int64_t header[2] = {static_cast<int64_t>(n), static_cast<int64_t>(block)};
    std::memcpy(base, header, sizeof header);
    const int64_t now = g_allocated.fetch_add(header[0], std::memory_order_relaxed) + header[0];
    raise(g_peak, now);
    if (block >= kCachedFrom) raise(g_reserved_peak, now + cached_bytes());
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
  s.reserved = s.allocated + cached_bytes();
  s.peak_allocated = std::max(s.allocated, g_peak.load(std::memory_order_relaxed));
  s.peak_reserved = std::max({s.reserved, s.peak_allocated, g_reserved_peak.load(std::memory_order_relaxed)});
  return s;
}

void reset_cpu_peak_memory() {
  const MemoryStats s = cpu_memory_stats();
  g_peak.store(s.allocated, std::memory_order_relaxed);
  g_reserved_peak.store(s.reserved, std::memory_order_relaxed);
}

int64_t trim_cpu_block_cache() {
  std::vector<char*> gone;
  int64_t bytes = 0;
  {
    BlockCache& c = cache();
    std::lock_guard<std::mutex> g(c.mu);
    for (auto& [size, kept] : c.free) {
      // Kept before the last trim and not handed out since: the oldest, at the front.
      size_t n = 0;
      while (n < kept.size() && kept[n].epoch < c.epoch) gone.push_back(kept[n++].base);
      kept.erase(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(n));
      bytes += static_cast<int64_t>(n * size);
    }
    c.cached -= bytes;
    ++c.epoch;
  }
  for (char* base : gone) c10::free_cpu(base);
  return bytes;
}

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
