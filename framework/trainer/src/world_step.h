// One step's figures on each rank (RankStep), and the same over all ranks (WorldStep): the one
// all-gather per step that carries every rank's loss share, tokens, samples and memory.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/framework/runtime/step_clock.h"
#include "phase_peaks.h"

namespace fsdpx {

struct RankStep {
  // This rank's share of each step's loss (over its micro-batches) since the losses were last
  // read: read from the device at log steps only, empty at the others. The same count on every rank.
  std::vector<double> losses;
  int64_t tokens = 0, samples = 0;
  int64_t rss_rise = -1;  // the step's peak RSS over the RSS before it; -1: unknown
  int64_t step_peak = 0;  // the step's peak RSS
  int64_t run_peak = 0;   // the run's peak RSS so far
  PhasePeaks allocated;   // the step's allocated peaks
  int64_t allocated_run_peak = 0;  // the run's allocated peak so far
  StepBreakdown breakdown;         // at log steps: the seconds of each phase since the last (StepClock)
  int64_t minor_faults = -1;       // the step's minor page faults (-1: unknown)
};

// The same on every rank (summed in rank order).
struct WorldStep {
  std::vector<double> losses;  // per step read: the mean over ranks of their loss shares
  double loss = 0;             // this step's (NaN where not read)
  int64_t tokens = 0, samples = 0;
  int64_t max_rss_rise = -1, max_step_peak = 0;
  std::vector<int64_t> run_peaks;  // per rank: peak RSS
  // Allocated bytes: the largest step peak over ranks, each phase's, and each rank's run peak; the
  // largest reserved peak of the step over ranks.
  int64_t max_allocated_peak = 0, max_reserved_peak = 0;
  int64_t max_phase_peaks[kStepPhases] = {0, 0, 0};
  std::vector<int64_t> allocated_run_peaks;
  std::vector<StepBreakdown> breakdowns;  // per rank, seconds per step (at log steps)
  std::vector<int64_t> minor_faults;      // per rank: the step's minor page faults
};

// Every rank's `mine`, combined. One all-gather over `world`. Collective.
WorldStep gather_step(Communicator& world, const RankStep& mine);

}  // namespace fsdpx
