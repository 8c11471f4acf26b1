// StepProfiler: what one step ran, by name, from the profiler LibTorch ships (Kineto): on a GPU its
// CUDA kernels by device time, on the CPU (and sim) its ATen operators by self time (an operator's
// time less the operators it called, so nothing is counted twice). --profile-step N.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace fsdpx {

class StepProfiler {
 public:
  // Starts profiling this thread's operators, and the GPU's kernels when `cuda`.
  void start(bool cuda);
  // Stops, and returns {"what": "cuda kernels" | "cpu operators", "total_s", "top": [{"name",
  // "calls", "seconds", "share"} ...]}: the `top` names that took most time, largest first.
  nlohmann::json stop(size_t top);
  bool running() const { return running_; }
  // One line for the log: "profile of step N (what): the three that took most, with their shares".
  static std::string summary_line(const nlohmann::json& profile, int64_t step);

 private:
  bool running_ = false, cuda_ = false;
};

}  // namespace fsdpx
