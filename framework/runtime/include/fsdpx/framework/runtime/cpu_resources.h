// What a rank may compute with on the CPU: how many threads, and whether bf16 is fast here.
#pragma once

#include <string>

#include "fsdpx/export.h"
#include "fsdpx/framework/runtime/topology_resolver.h"

namespace fsdpx {

struct ThreadChoice {
  int threads = 1;  // intra-op threads per rank
  std::string why;  // e.g. "2 CPU(s) in the affinity mask / 2 local rank(s); OMP_NUM_THREADS overrides"
};

// Intra-op threads per rank: OMP_NUM_THREADS when the user set it; else SLURM_CPUS_PER_TASK
// under Slurm (each task has its own CPUs); else the CPUs this process may run on
// (`affinity_cpus`) shared by the `local_ranks` ranks of this node, at least 1. Two ranks at
// LibTorch's default (every core each) oversubscribe the cores and run slower than one thread
// each. Throws fsdpx::Error if OMP_NUM_THREADS is set but not a positive integer.
FSDPX_API ThreadChoice choose_threads(const Environment& env, int local_ranks, int affinity_cpus);

// The CPUs in this process's affinity mask (sched_getaffinity).
FSDPX_API int affinity_cpus();

// Whether `cpu_flags` (the "flags" of /proc/cpuinfo) name a native bf16 dot product
// (avx512_bf16 or amx_bf16). Without one, LibTorch's bf16 matmuls on the CPU run far slower than
// fp32 (about 100x on an AVX2 CPU).
FSDPX_API bool has_fast_bf16(const std::string& cpu_flags);
// The flags of this machine's first CPU in /proc/cpuinfo ("" if it cannot be read).
FSDPX_API std::string cpu_flags();

}  // namespace fsdpx
