// Exact memory accounting: what LibTorch's allocators hand out, now and at peak.
//
// On the CPU, RSS depends on glibc's caching and on the sanitizers; what a run holds is better
// measured at the allocator. install_cpu_memory_accounting() makes a counting allocator
// LibTorch's CPU allocator; every CPU tensor allocated after that is counted until it is freed.
// The figures use the fields of CUDA's caching-allocator statistics (allocated and reserved,
// current and peak), so that a device reports in the same terms.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include "fsdpx/export.h"

namespace fsdpx {

// Bytes of one allocator. On the CPU, reserved is what the allocator holds from the system: the
// block cache's segments (their free blocks included) and the smaller blocks, headers included.
struct MemoryStats {
  int64_t allocated = 0, peak_allocated = 0;
  int64_t reserved = 0, peak_reserved = 0;
};

// Makes the counting allocator LibTorch's CPU allocator (c10::SetCPUAllocator). Idempotent and
// thread-safe. Call it before the first tensor: tensors allocated earlier are not counted (and
// freeing them does not disturb the count).
FSDPX_API void install_cpu_memory_accounting();
// Whether install_cpu_memory_accounting() has run in this process.
FSDPX_API bool cpu_memory_accounting_installed();
// The CPU allocator's figures since installation (all zero when not installed).
FSDPX_API MemoryStats cpu_memory_stats();
// Restarts the peaks from the current figures, so that the peak of a phase can be read after it.
FSDPX_API void reset_cpu_peak_memory();
// The counting allocator keeps the blocks of 1 MiB and more that are freed, and hands their bytes
// out again to later requests of any size (split and merged, as CUDA's caching allocator does),
// instead of returning them to the system and faulting their pages in again: a step allocates
// about the same every step. This releases the kept segments that no request used since the
// previous call, and returns their bytes; fsdpx-train calls it after every step, so what a step
// stops using goes within two steps. Thread-safe. FSDPX_CPU_BLOCK_CACHE=0 turns the cache off
// (every block goes back to the system when freed).
FSDPX_API int64_t trim_cpu_block_cache();
// What the block cache holds resident beyond the most the step has in use, once the step's blocks
// have settled into its segments, in percent: what a plan counts. The cache keeps 2 to 25%
// (cpu_block_cache.h); gpt at 1b width settles at 3 to 8% (docs/memory.md).
constexpr int kCpuBlockCacheSlackPercent = 5;

// Resizes `storage` to `bytes` in place (0 frees its bytes; the storage object and every tensor
// over it stay), on the CPU (contents kept up to the smaller size) or a device (contents not
// kept). For buffers whose bytes must go at a known point whoever else still holds them, e.g. a
// finished collective's bookkeeping: memory is freed by protocol, not by reference counts.
FSDPX_API void resize_storage_bytes(const c10::Storage& storage, size_t bytes);
// Frees `t`'s bytes now (resize_storage_bytes(t.storage(), 0)) and drops `t`; a no-op when undefined.
FSDPX_API void free_now(at::Tensor& t);

// This process's resident set (VmRSS), in bytes; -1 when /proc cannot tell.
FSDPX_API int64_t resident_bytes();

// The memory this node can give processes, in bytes: MemAvailable from /proc/meminfo, or less
// when this process's memory cgroup (v1 or v2) has a lower limit (its limit minus its usage).
// `source` says which bound applied. -1 when neither can be read.
struct AvailableMemory {
  int64_t bytes = -1;
  std::string source;  // "MemAvailable" or "cgroup <path> limit"
};
FSDPX_API AvailableMemory available_memory();

}  // namespace fsdpx
