// Seconds on the steady clock since a time point: the trainer's one stopwatch (step phases, ETA,
// peak probe, checkpoint stalls and writes).
#pragma once

#include <chrono>

namespace fsdpx {

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace fsdpx
