#include "fsdpx/framework/runtime/cpu_resources.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "environment_values.h"
#include "fsdpx/error.h"

namespace fsdpx {
ThreadChoice choose_threads(const Environment& env, int local_ranks, int affinity) {
  if (auto n = env_int(env, "OMP_NUM_THREADS")) {
    if (*n < 1) throw Error("OMP_NUM_THREADS=0: a rank needs at least 1 thread; unset it to let fsdpx choose");
    return {*n, "OMP_NUM_THREADS"};
  }
  if (auto n = env_int(env, "SLURM_CPUS_PER_TASK"); n && *n > 0)
    return {*n, "SLURM_CPUS_PER_TASK; OMP_NUM_THREADS overrides"};
  const int ranks = std::max(1, local_ranks), cpus = std::max(1, affinity);
  return {std::max(1, cpus / ranks), std::to_string(cpus) + " CPU(s) in the affinity mask / " + std::to_string(ranks) +
                                         " local rank(s); OMP_NUM_THREADS overrides"};
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

bool has_fast_bf16(const std::string& flags) {
  std::istringstream words(flags);
  for (std::string w; words >> w;)
    if (w == "avx512_bf16" || w == "amx_bf16") return true;
  return false;
}

std::string cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("flags", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? "" : line.substr(colon + 1);
    }
  return "";
}

}  // namespace fsdpx
