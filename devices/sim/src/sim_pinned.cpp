// Simulated pinned (page-locked) host memory.
//
// Reached through the hooks: at::empty(..., pin_memory=true) on CPU calls
// GetCPUAllocatorMaybePinned(true) -> (no CUDA) -> at::getAccelerator() ==
// PrivateUse1 -> Context::getPinnedMemoryAllocator -> lazyInitDevice(PU1)
// (hooks.init()) -> hooks.getPinnedMemoryAllocator() == this allocator.
// Tensor::is_pinned() -> Context::isPinnedPtr -> hooks.isPinnedPtr, which
// answers from the registry below (any interior pointer counts, like
// cudaPointerGetAttributes).
//
// The memory is a block of LibTorch's CPU allocator (not mlock'ed: locking
// would need RLIMIT_MEMLOCK and gains nothing here), so a counting CPU
// allocator (fsdpx's memory accounting) counts pinned bytes as host bytes.
// DataPtr device is CPU, so the tensors are plain CPU tensors that merely
// remember being pinned.
// Not modelled: the pinned caching host allocator (blocks reused only after
// the copies that used them completed), and the asynchronous DMA that makes
// non_blocking copies from pinned memory overlap with compute.
#include "fsdpx/sim/sim.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

namespace fsdpx::sim {

namespace {

struct PinnedRegistry {
  std::mutex mu;
  std::map<uintptr_t, size_t> blocks;  // base -> bytes
  PinnedStats stats{0, 0, 0, 0};
};

PinnedRegistry& preg() {
  static auto* r = new PinnedRegistry();  // leaked: frees may run at exit
  return *r;
}

// A pinned block: the CPU allocator's DataPtr, kept until the pinned one goes.
struct PinnedBlock {
  c10::DataPtr inner;
  size_t bytes = 0;
};

void pinned_free(void* context) {
  auto* block = static_cast<PinnedBlock*>(context);
  {
    auto& r = preg();
    std::lock_guard<std::mutex> g(r.mu);
    r.blocks.erase(reinterpret_cast<uintptr_t>(block->inner.get()));
    r.stats.current_bytes -= static_cast<int64_t>(block->bytes);
    r.stats.live_blocks -= 1;
  }
  delete block;  // frees the CPU allocator's block
}

class SimPinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    auto* block = new PinnedBlock{c10::GetCPUAllocator()->allocate(n), n};
    void* p = block->inner.get();
    auto& r = preg();
    std::lock_guard<std::mutex> g(r.mu);
    r.blocks.emplace(reinterpret_cast<uintptr_t>(p), n);
    r.stats.current_bytes += static_cast<int64_t>(n);
    r.stats.peak_bytes = std::max(r.stats.peak_bytes, r.stats.current_bytes);
    r.stats.total_allocs += 1;
    r.stats.live_blocks += 1;
    return c10::DataPtr(p, block, &pinned_free, c10::Device(c10::kCPU));
  }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }
};

SimPinnedAllocator g_pinned;

}  // namespace

c10::Allocator* pinned_allocator() { return &g_pinned; }

bool is_pinned_ptr(const void* p) {
  if (p == nullptr) return false;
  auto& r = preg();
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.blocks.upper_bound(a);
  if (it == r.blocks.begin()) return false;
  --it;
  return a < it->first + it->second;
}

PinnedStats pinned_stats() {
  auto& r = preg();
  std::lock_guard<std::mutex> g(r.mu);
  return r.stats;
}

void reset_pinned_peak() {
  auto& r = preg();
  std::lock_guard<std::mutex> g(r.mu);
  r.stats.peak_bytes = r.stats.current_bytes;
}

}  // namespace fsdpx::sim
