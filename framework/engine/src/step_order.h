// The order of a step, written once: the rules the engine (ShardingEngine::Impl, Unit,
// ParamGroup) follows with tensors and the memory plan (memory_plan.cpp's Replay) follows with
// byte counts. Each decision about *when* something happens in a step lives here, and both call
// it; what happens (a collective, a buffer's bytes) stays with each.
//
// A step, for units in the order their forward began (the root first):
//   forward   each unit gathers (unless prefetched) as its forward begins, then prefetches the
//             next ones; a unit that reshards after forward frees its gathered parameters as its
//             forward ends.
//   backward  the units in reverse order; each gathers as its backward begins; once half of its
//             gradient elements have arrived it progresses: the reduction in flight finishes and
//             the next units are prefetched; at its end it frees its gathered parameters and
//             issues its reduction, which stays in flight until the next unit progresses (or the
//             backward ends). With activation offload, a recomputed unit's inputs leave for host
//             memory in its forward and come back as the backward of the unit before it in
//             backward order begins (loads_at_backward).
// Both follow it event by event: StepTrace names the events, and EngineSteps.TheMemoryPlanFollows
// TheEnginesStep (tests/unit/engine_test.cpp) compares the two traces.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fsdpx/framework/engine/step_trace.h"

namespace fsdpx {

// The backward visits the units in the reverse of the order their forward began.
template <class U>
std::vector<U> backward_order(const std::vector<U>& forward_order) {
  return std::vector<U>(forward_order.rbegin(), forward_order.rend());
}

// After `u` (its forward began, or its backward progressed): the next `prefetch` units of `order`
// that are not through their backward; `gather(v)` issues v's all-gather where it still needs one.
// Without overlap nothing is prefetched.
template <class U, class Done, class Gather>
void prefetch_after(const std::vector<U>& order, const U& u, bool overlap, int prefetch, Done through_backward,
                    Gather gather) {
  if (!overlap) return;
  auto it = std::find(order.begin(), order.end(), u);
  if (it == order.end()) return;
  int issued = 0;
  for (++it; it != order.end() && issued < prefetch; ++it) {
    if (through_backward(*it)) continue;
    gather(*it);
    ++issued;
  }
}

// Activation offload: as `u`'s backward begins, the offloaded inputs of `u` come back, and those of
// the unit after it in `backward` order: one unit ahead.
template <class U>
std::vector<U> loads_at_backward(const std::vector<U>& backward, const U& u) {
  std::vector<U> loads{u};
  auto it = std::find(backward.begin(), backward.end(), u);
  if (it != backward.end() && ++it != backward.end()) loads.push_back(*it);
  return loads;
}

// A unit's backward progresses once this many of its `grad_elements` trainable elements have
// their gradients: half (and at once for a unit without any).
inline int64_t progress_after(int64_t grad_elements) { return (grad_elements + 1) / 2; }

// Records one event of the step (step_trace.h) for the root, or the unit with path `unit`.
// Nothing is built without a sink: the engine calls it on every gather, free and reduction.
inline void trace_step(const StepTrace& sink, const char* what, bool root, const std::string& unit) {
  if (sink) sink(std::string(what) + " " + (root ? std::string("(root)") : unit));
}

}  // namespace fsdpx
