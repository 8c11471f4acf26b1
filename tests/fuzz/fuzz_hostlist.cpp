// Slurm's SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE as the topology resolver expands them.
#include <string>

#include "fsdpx/framework/runtime/topology_resolver.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fsdpx::fuzz::expect_clear_errors([&] { fsdpx::expand_hostlist(text); });
  fsdpx::fuzz::expect_clear_errors([&] { fsdpx::expand_tasks_per_node(text); });
  return 0;
}
