// What a step measures and how the ranks agree on it: memory from /proc, and the one
// all-gather per step that carries every rank's loss share, tokens, samples and memory.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "fsdpx/framework/runtime/communicator.h"

namespace fsdpx {

// VmRSS and VmHWM of this process in bytes; -1 when /proc cannot tell.
struct ProcMemory {
  int64_t rss = -1, hwm = -1;
};
ProcMemory proc_memory();
// The peak RSS of the process so far (getrusage), in bytes.
int64_t peak_rss_bytes();
// Restarts VmHWM from the current RSS (Linux: "5" to /proc/self/clear_refs), so that the peak of
// one step can be read after it. False when the system does not allow it.
bool reset_peak_rss();

// The phases of a step whose allocated peaks are reported apart.
enum class StepPhase { Forward = 0, Backward, Optimizer };
constexpr int kStepPhases = 3;
const char* phase_name(StepPhase p);  // "forward", "backward", "optimizer"

// The allocated peak of each phase of a step (memory_accounting.h): begin() at the start of the
// step, end(phase) after each phase (a phase may recur, e.g. per micro-batch: its peak is the
// largest).
class PhasePeaks {
 public:
  void begin();
  void end(StepPhase phase);
  int64_t peak(StepPhase phase) const { return peaks_[static_cast<int>(phase)]; }
  int64_t step_peak() const;  // the largest of the phases
  int64_t at_start() const { return at_start_; }  // allocated when the step began

 private:
  int64_t peaks_[kStepPhases] = {0, 0, 0};
  int64_t at_start_ = 0;
};

// One rank's figures of one step.
struct RankStep {
  double loss_sum = 0;   // this rank's share of the step's loss (over its micro-batches)
  int64_t tokens = 0, samples = 0;
  int64_t rss_rise = -1;  // the step's peak RSS over the RSS before it; -1: unknown
  int64_t step_peak = 0;  // the step's peak RSS
  int64_t run_peak = 0;   // the run's peak RSS so far
  PhasePeaks allocated;   // the step's allocated peaks
  int64_t allocated_run_peak = 0;  // the run's allocated peak so far
};

// The step over all ranks, the same on every rank (summed in rank order).
struct WorldStep {
  double loss = 0;  // mean over ranks of their loss shares
  int64_t tokens = 0, samples = 0;
  int64_t max_rss_rise = -1, max_step_peak = 0;
  std::vector<int64_t> run_peaks;  // per rank: peak RSS
  // Allocated bytes: the largest step peak over ranks, each phase's, and each rank's run peak.
  int64_t max_allocated_peak = 0;
  int64_t max_phase_peaks[kStepPhases] = {0, 0, 0};
  std::vector<int64_t> allocated_run_peaks;
};

// One all-gather over `world`. Collective.
WorldStep gather_step(Communicator& world, const RankStep& mine);

// Bytes moved, summed over the counted communicators: all-gather, reduce-scatter, all-reduce
// payloads, what this rank sent, and the all-to-all payload.
using CommTotals = std::array<int64_t, 5>;
class CommCounters {
 public:
  void add(std::shared_ptr<CountingCommunicator> c);
  CommTotals totals() const;

 private:
  std::vector<std::shared_ptr<CountingCommunicator>> counters_;
};

}  // namespace fsdpx
