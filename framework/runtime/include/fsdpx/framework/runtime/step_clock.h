// StepClock: where a training step's time goes, by phase, with one definition on every device.
//
// A mark is a point on the compute stream's timeline: on the CPU the host's clock (the host is
// the compute stream there), on a device a timing event recorded on the compute stream, so that
// a span is what the compute stream spent between two marks (sim's events carry the host's time
// at record, as its kernels run at issue). A wait is the span around the compute stream's wait
// for a collective: on a GPU how long it stalled, on the CPU how long the host blocked in Gloo.
//
// The phases of a step:
//   forward, backward      the spans of the passes, less the waits inside them;
//   all_gather_wait        the compute stream waiting for an all-gather (a unit's parameters);
//   reduce_scatter_wait    the compute stream waiting for a gradient reduction to be finished
//                          (the reduce-scatter or unsharded all-reduce, hybrid's all-reduce across
//                          replicas, and, offloading, the copy of the reduced shard to the host);
//   optimizer              loss-scale check, clipping and the optimizer's step;
//   other                  the rest of the step: the data, the loss's bookkeeping.
// The host waits for the device's marks only in take(), which the trainer calls at log steps,
// where it waits for the losses anyway, and, so that the marks held stay bounded over a long log
// interval, at the end of a step once more than kMaxPendingMarks are held (on the CPU the spans
// are added up at every step's end).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "fsdpx/export.h"
#include "fsdpx/framework/runtime/device.h"

namespace fsdpx {

enum class TimedPhase { Forward = 0, Backward, AllGatherWait, ReduceScatterWait, Optimizer, Step };
constexpr int kTimedPhases = 6;  // with Step, the span of the whole step

// Seconds per phase; `other` is the step's span less every phase inside it.
struct StepBreakdown {
  double forward = 0, backward = 0, all_gather_wait = 0, reduce_scatter_wait = 0, optimizer = 0, other = 0;
  int64_t steps = 0;  // the steps these seconds add up
  std::vector<double> values() const {
    return {forward, backward, all_gather_wait, reduce_scatter_wait, optimizer, other};
  }
  static const std::array<const char*, 6>& names();  // "forward", ..., "other", in values()'s order
  static StepBreakdown from_values(const std::vector<double>& v, int64_t steps);
  StepBreakdown per_step() const;  // each phase divided by `steps`
};

class FSDPX_API StepClock {
 public:
  explicit StepClock(std::shared_ptr<const DeviceRuntime> device);
  ~StepClock();
  StepClock(const StepClock&) = delete;
  StepClock& operator=(const StepClock&) = delete;

  // A point on the compute stream's timeline, now.
  size_t mark();
  // The span from `begin` (a mark) to now is `phase`'s. Forward, Backward and Optimizer spans
  // hold the waits added while they were the outer phase (enter), which take() takes out of them.
  // Spans outside a step (between a Step span's start and end) are not counted: evaluation's
  // passes, the warm-up of a probe.
  void add(TimedPhase phase, size_t begin);
  // The outer phase the waits from now on fall in (Forward, Backward, Optimizer or Step).
  void enter(TimedPhase outer) { outer_ = outer; }
  TimedPhase outer() const { return outer_; }
  // Whether a step's span is open: the engine marks its waits only then.
  bool stepping() const { return stepping_; }
  void set_stepping(bool on) { stepping_ = on; }
  // The step ended: one more step in the next take().
  void step_done();

  // Every span since the last take(), in seconds per phase. On a device, waits for the marks.
  StepBreakdown take();

 private:
  struct Span {
    TimedPhase phase, outer;
    size_t begin, end;
  };
  double seconds(size_t begin, size_t end) const;
  // Adds every span so far to the totals and drops the marks (no span may be open).
  void fold();
  static constexpr size_t kMaxPendingMarks = 4096;

  struct Marks;  // host times, or timing events on the compute stream
  std::shared_ptr<const DeviceRuntime> device_;
  std::unique_ptr<Marks> marks_;
  std::vector<Span> spans_;
  std::array<double, kTimedPhases> total_{}, waits_inside_{};  // seconds of the spans folded, by phase
  TimedPhase outer_ = TimedPhase::Step;
  bool stepping_ = false;
  int64_t steps_ = 0;
};

// Marks the span of `phase` on `clock` from construction to destruction (nothing when `clock` is
// null); an outer phase (Forward, Backward, Optimizer) is the one its waits fall in meanwhile.
class FSDPX_API TimedSpan {
 public:
  TimedSpan(StepClock* clock, TimedPhase phase);
  ~TimedSpan();
  TimedSpan(const TimedSpan&) = delete;
  TimedSpan& operator=(const TimedSpan&) = delete;

 private:
  StepClock* clock_;
  TimedPhase phase_, outer_before_;
  size_t begin_ = 0;
};

}  // namespace fsdpx
