#include "phase_peaks.h"

#include <algorithm>
#include <iterator>

#include "fsdpx/framework/runtime/memory_accounting.h"

namespace fsdpx {

const char* phase_name(StepPhase p) {
  switch (p) {
    case StepPhase::Forward: return "forward";
    case StepPhase::Backward: return "backward";
    case StepPhase::Optimizer: return "optimizer";
  }
  return "step";
}

void PhasePeaks::begin(const DeviceRuntime& device) {
  device_ = &device;
  device.reset_peak_memory();
  at_start_ = device.memory_stats().allocated;
  for (auto& p : peaks_) p = 0;
  reserved_peak_ = 0;
}

void PhasePeaks::end(StepPhase phase) {
  int64_t& p = peaks_[static_cast<int>(phase)];
  const MemoryStats m = device_->memory_stats();
  p = std::max(p, m.peak_allocated);
  reserved_peak_ = std::max(reserved_peak_, m.peak_reserved);
  device_->reset_peak_memory();
}

int64_t PhasePeaks::step_peak() const { return *std::max_element(std::begin(peaks_), std::end(peaks_)); }

}  // namespace fsdpx
