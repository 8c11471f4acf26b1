// LrSchedule: the learning rate of each step, owned by the trainer (so every optimizer plugin
// gets the same schedules; an optimizer's `lr` option is the peak, base_lr()).
#pragma once

#include <cstdint>
#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

struct FSDPX_API LrSchedule {
  enum class Kind { Constant, WarmupCosine };
  Kind kind = Kind::Constant;
  double peak = 1e-3;
  int64_t warmup_steps = 0;   // linear from peak / warmup_steps up to peak
  int64_t total_steps = 1;    // cosine decays from the end of warm-up to total_steps
  double min_ratio = 0.0;     // the floor of the cosine, as a fraction of peak

  // "constant" or "cosine"; throws fsdpx::Error naming the bad value (unknown kind, negative
  // warm-up, warm-up longer than the run, min_ratio outside [0, 1], peak not positive).
  static LrSchedule parse(const std::string& kind, double peak, int64_t warmup_steps, int64_t total_steps,
                          double min_ratio);

  // The learning rate of step `step` (0-based).
  double at(int64_t step) const;
};

}  // namespace fsdpx
