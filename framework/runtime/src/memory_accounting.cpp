#include "fsdpx/framework/runtime/memory_accounting.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include <ATen/native/Resize.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/alloc_cpu.h>

namespace fsdpx {
namespace {

std::atomic<int64_t> g_allocated{0}, g_peak{0};
std::atomic<bool> g_installed{false};

// Each block carries its size in a header of one alignment unit before the bytes handed out,
// so that the deleter needs no table: the data pointer is its own context (raw_allocate works).
constexpr size_t kHeader = 64;  // c10's CPU alignment: the bytes after it stay aligned as alloc_cpu's

void raise_peak(int64_t now) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void counted_free(void* data) {
  if (!data) return;
  char* base = static_cast<char*>(data) - kHeader;
  int64_t n = 0;
  std::memcpy(&n, base, sizeof n);
  g_allocated.fetch_sub(n, std::memory_order_relaxed);
  c10::free_cpu(base);
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &counted_free, c10::Device(c10::DeviceType::CPU)};
    char* base = static_cast<char*>(c10::alloc_cpu(n + kHeader));  // throws c10::Error when out of memory
    const int64_t bytes = static_cast<int64_t>(n);
    std::memcpy(base, &bytes, sizeof bytes);
    raise_peak(g_allocated.fetch_add(bytes, std::memory_order_relaxed) + bytes);
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
  s.allocated = s.reserved = g_allocated.load(std::memory_order_relaxed);
  s.peak_allocated = s.peak_reserved = std::max(s.allocated, g_peak.load(std::memory_order_relaxed));
  return s;
}

void reset_cpu_peak_memory() { g_peak.store(g_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed); }

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
}
