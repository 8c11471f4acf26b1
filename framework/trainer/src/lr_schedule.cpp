#include "fsdpx/framework/trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "fsdpx/error.h"

namespace fsdpx {

LrSchedule LrSchedule::parse(const std::string& kind, double peak, int64_t warmup_steps, int64_t total_steps,
                             double min_ratio) {
  LrSchedule s;
  if (kind == "constant") s.kind = Kind::Constant;
  else if (kind == "cosine") s.kind = Kind::WarmupCosine;
  else throw Error("unknown learning-rate schedule '" + kind + "'; use constant or cosine");
  if (!(peak > 0)) throw Error("the peak learning rate must be positive, got " + std::to_string(peak));
  if (warmup_steps < 0) throw Error("warm-up steps must not be negative, got " + std::to_string(warmup_steps));
  if (total_steps < 1) throw Error("the run must have at least one step, got " + std::to_string(total_steps));
  if (warmup_steps > total_steps)
    throw Error("warm-up (" + std::to_string(warmup_steps) + " steps) is longer than the run (" +
                std::to_string(total_steps) + " steps)");
  if (!(min_ratio >= 0 && min_ratio <= 1)) throw Error("min_ratio must be in [0, 1], got " + std::to_string(min_ratio));
  s.peak = peak;
  s.warmup_steps = warmup_steps;
  s.total_steps = total_steps;
  s.min_ratio = min_ratio;
  return s;
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == Kind::Constant) return peak;
  const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(span));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak * (min_ratio + (1.0 - min_ratio) * cosine);
}

}  // namespace fsdpx
