// PhasePeaks: the allocated peak of each phase of a step, and the step's reserved peak
// (memory_accounting.h).
#pragma once

#include <cstdint>

#include "fsdpx/framework/runtime/device.h"

namespace fsdpx {

// The phases of a step whose allocated peaks are reported apart.
enum class StepPhase { Forward = 0, Backward, Optimizer };
constexpr int kStepPhases = 3;
const char* phase_name(StepPhase p);  // "forward", "backward", "optimizer"

// begin() at the start of the step, end(phase) after each phase (a phase may recur, e.g. per
// micro-batch: its peak is the largest). The bytes of the device's allocator (on the CPU, the
// counting allocator's).
class PhasePeaks {
 public:
  void begin(const DeviceRuntime& device);
  void end(StepPhase phase);
  int64_t peak(StepPhase phase) const { return peaks_[static_cast<int>(phase)]; }
  int64_t step_peak() const;  // the largest of the phases
  // The most the allocator held from the system during the step (on the CPU, what is resident of it).
  int64_t reserved_peak() const { return reserved_peak_; }
  int64_t at_start() const { return at_start_; }  // allocated when the step began

 private:
  int64_t peaks_[kStepPhases] = {0, 0, 0};
  int64_t at_start_ = 0, reserved_peak_ = 0;
  const DeviceRuntime* device_ = nullptr;
};

}  // namespace fsdpx
