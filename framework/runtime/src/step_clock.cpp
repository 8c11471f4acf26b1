#include "fsdpx/framework/runtime/step_clock.h"

#include <c10/core/Event.h>

#include <deque>

namespace fsdpx {

const std::array<const char*, 6>& StepBreakdown::names() {
  static const std::array<const char*, 6> n = {"forward",   "backward", "all_gather_wait", "reduce_scatter_wait",
                                               "optimizer", "other"};
  return n;
}

StepBreakdown StepBreakdown::from_values(const std::vector<double>& v, int64_t steps) {
  StepBreakdown b;
  double* fields[] = {&b.forward, &b.backward, &b.all_gather_wait, &b.reduce_scatter_wait, &b.optimizer, &b.other};
  for (size_t i = 0; i < 6 && i < v.size(); ++i) *fields[i] = v[i];
  b.steps = steps;
  return b;
}

StepBreakdown StepBreakdown::per_step() const {
  std::vector<double> v = values();
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  for (double& x : v) x /= n;
  return from_values(v, 1);
}

struct StepClock::Marks {
  std::vector<std::chrono::steady_clock::time_point> host;
  std::deque<c10::Event> events;  // deque: an Event does not move once recorded
};

StepClock::StepClock(std::shared_ptr<const DeviceRuntime> device)
    : device_(std::move(device)), marks_(std::make_unique<Marks>()) {}
StepClock::~StepClock() = default;

size_t StepClock::mark() {
  if (device_->is_cpu()) {
    marks_->host.push_back(std::chrono::steady_clock::now());
    return marks_->host.size() - 1;
  }
  marks_->events.emplace_back(device_->device().type(), c10::EventFlag::BACKEND_DEFAULT);  // with timing
  marks_->events.back().record(device_->stream(StreamRole::Compute));
  return marks_->events.size() - 1;
}

void StepClock::add(TimedPhase phase, size_t begin) {
  if (!stepping_ && phase != TimedPhase::Step) return;
  const size_t end = mark();
  spans_.push_back(Span{phase, outer_, begin, end});
}

double StepClock::seconds(size_t begin, size_t end) const {
  if (device_->is_cpu()) return std::chrono::duration<double>(marks_->host[end] - marks_->host[begin]).count();
  return marks_->events[begin].elapsedTime(marks_->events[end]) / 1e3;  // milliseconds
}

void StepClock::step_done() {
  ++steps_;
  if (device_->is_cpu() || marks_->events.size() > kMaxPendingMarks) fold();
}

void StepClock::fold() {
  if (!device_->is_cpu() && !marks_->events.empty()) marks_->events.back().synchronize();
  for (const Span& s : spans_) {
    const double d = seconds(s.begin, s.end);
    total_[static_cast<size_t>(s.phase)] += d;
    if (s.phase == TimedPhase::AllGatherWait || s.phase == TimedPhase::ReduceScatterWait)
      waits_inside_[static_cast<size_t>(s.outer)] += d;
  }
  spans_.clear();
  marks_->host.clear();
  marks_->events.clear();
}

StepBreakdown StepClock::take() {
  fold();
  auto at = [&](TimedPhase p) { return total_[static_cast<size_t>(p)]; };
  auto inside = [&](TimedPhase p) { return waits_inside_[static_cast<size_t>(p)]; };
  StepBreakdown b;
  b.forward = at(TimedPhase::Forward) - inside(TimedPhase::Forward);
  b.backward = at(TimedPhase::Backward) - inside(TimedPhase::Backward);
  b.all_gather_wait = at(TimedPhase::AllGatherWait);
  b.reduce_scatter_wait = at(TimedPhase::ReduceScatterWait);
  b.optimizer = at(TimedPhase::Optimizer) - inside(TimedPhase::Optimizer);
  b.other = at(TimedPhase::Step) - (b.forward + b.backward + b.all_gather_wait + b.reduce_scatter_wait + b.optimizer);
  b.steps = steps_;
  total_ = {};
  waits_inside_ = {};
  steps_ = 0;
  return b;
}

TimedSpan::TimedSpan(StepClock* clock, TimedPhase phase) : clock_(clock), phase_(phase), outer_before_() {
  if (!clock_) return;
  outer_before_ = clock_->outer();
  if (phase_ == TimedPhase::Forward || phase_ == TimedPhase::Backward || phase_ == TimedPhase::Optimizer)
    clock_->enter(phase_);
  if (phase_ == TimedPhase::Step) clock_->set_stepping(true);
  begin_ = clock_->mark();
}

TimedSpan::~TimedSpan() {
  if (!clock_) return;
  clock_->add(phase_, begin_);
  clock_->enter(outer_before_);
  if (phase_ == TimedPhase::Step) clock_->set_stepping(false);
}

}  // namespace fsdpx
