#include "fsdpx/framework/runtime/cpu_resources.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "fsdpx/error.h"

namespace fsdpx {
namespace {

// A positive integer from `text`, or 0.
int positive(const std::string& text) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  return !text.empty() && *end == '\0' && v > 0 && v < (1 << 20) ? static_cast<int>(v) : 0;
}

}  // namespace

ThreadChoice choose_threads(const Environment& env, int local_ranks, int affinity) {
  auto omp = env.find("OMP_NUM_THREADS");
  if (omp != env.end() && !omp->second.empty()) {
    const int n = positive(omp->second);
    if (n == 0) throw Error("OMP_NUM_THREADS=" + omp->second + " is not a positive number of threads; unset it to let fsdpx choose");
    return {n, "OMP_NUM_THREADS"};
  }
  auto slurm = env.find("SLURM_CPUS_PER_TASK");
  if (slurm != env.end() && positive(slurm->second) > 0)
    return {positive(slurm->second), "SLURM_CPUS_PER_TASK; OMP_NUM_THREADS overrides"};
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
