#include "world_step.h"

#include <algorithm>

#include "fsdpx/framework/runtime/every_rank.h"

namespace fsdpx {

WorldStep gather_step(Communicator& world, const RankStep& mine) {
  std::vector<double> f = {mine.loss_sum,
                           static_cast<double>(mine.tokens),
                           static_cast<double>(mine.samples),
                           static_cast<double>(mine.rss_rise),
                           static_cast<double>(mine.step_peak),
                           static_cast<double>(mine.run_peak),
                           static_cast<double>(mine.allocated.step_peak()),
                           static_cast<double>(mine.allocated_run_peak)};
  for (int k = 0; k < kStepPhases; ++k) f.push_back(static_cast<double>(mine.allocated.peak(static_cast<StepPhase>(k))));
  WorldStep w;
  double loss = 0, tokens = 0, samples = 0, rise = -1, peak = 0;
  for (const std::vector<double>& a : from_every_rank(world, f)) {  // in rank order: the same result on every rank
    loss += a[0];
    tokens += a[1];
    samples += a[2];
    rise = std::max(rise, a[3]);
    peak = std::max(peak, a[4]);
    w.run_peaks.push_back(static_cast<int64_t>(a[5]));
    w.max_allocated_peak = std::max(w.max_allocated_peak, static_cast<int64_t>(a[6]));
    w.allocated_run_peaks.push_back(static_cast<int64_t>(a[7]));
    for (int k = 0; k < kStepPhases; ++k) w.max_phase_peaks[k] = std::max(w.max_phase_peaks[k], static_cast<int64_t>(a[8 + k]));
  }
  w.loss = loss / world.size();
  w.tokens = static_cast<int64_t>(tokens);
  w.samples = static_cast<int64_t>(samples);
  w.max_rss_rise = static_cast<int64_t>(rise);
  w.max_step_peak = static_cast<int64_t>(peak);
  return w;
}

}  // namespace fsdpx
