#include "world_step.h"

#include <algorithm>
#include <cmath>

#include "fsdpx/framework/runtime/every_rank.h"

namespace fsdpx {

WorldStep gather_step(Communicator& world, const RankStep& mine) {
  std::vector<double> f = {static_cast<double>(mine.tokens),
                           static_cast<double>(mine.samples),
                           static_cast<double>(mine.rss_rise),
                           static_cast<double>(mine.step_peak),
                           static_cast<double>(mine.run_peak),
                           static_cast<double>(mine.allocated.step_peak()),
                           static_cast<double>(mine.allocated_run_peak),
                           static_cast<double>(mine.minor_faults),
                           static_cast<double>(mine.allocated.reserved_peak())};
  for (int k = 0; k < kStepPhases; ++k)  // from a[9]
    f.push_back(static_cast<double>(mine.allocated.peak(static_cast<StepPhase>(k))));
  const size_t timed = f.size();
  for (double s : mine.breakdown.per_step().values()) f.push_back(s);
  const size_t fixed = f.size();
  f.insert(f.end(), mine.losses.begin(), mine.losses.end());
  WorldStep w;
  w.losses.assign(mine.losses.size(), 0.0);
  double tokens = 0, samples = 0, rise = -1, peak = 0;
  for (const std::vector<double>& a : from_every_rank(world, f)) {  // in rank order: the same result on every rank
    tokens += a[0];
    samples += a[1];
    rise = std::max(rise, a[2]);
    peak = std::max(peak, a[3]);
    w.run_peaks.push_back(static_cast<int64_t>(a[4]));
    w.max_allocated_peak = std::max(w.max_allocated_peak, static_cast<int64_t>(a[5]));
    w.allocated_run_peaks.push_back(static_cast<int64_t>(a[6]));
    for (int k = 0; k < kStepPhases; ++k)
      w.max_phase_peaks[k] = std::max(w.max_phase_peaks[k], static_cast<int64_t>(a[9 + k]));
    w.max_reserved_peak = std::max(w.max_reserved_peak, static_cast<int64_t>(a[8]));
    w.minor_faults.push_back(static_cast<int64_t>(a[7]));
    w.breakdowns.push_back(StepBreakdown::from_values(std::vector<double>(a.begin() + timed, a.begin() + fixed), 1));
    for (size_t i = 0; i < w.losses.size() && fixed + i < a.size(); ++i) w.losses[i] += a[fixed + i];
  }
  for (double& l : w.losses) l /= world.size();
  w.loss = w.losses.empty() ? std::nan("") : w.losses.back();
  w.tokens = static_cast<int64_t>(tokens);
  w.samples = static_cast<int64_t>(samples);
  w.max_rss_rise = static_cast<int64_t>(rise);
  w.max_step_peak = static_cast<int64_t>(peak);
  return w;
}

}  // namespace fsdpx
