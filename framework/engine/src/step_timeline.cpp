#include "step_timeline.h"

#include <algorithm>
#include <utility>

namespace fsdpx {

namespace {

// The fields a pass adds to, so that a pass standing for several adds each again.
std::vector<double StepTime::*> pass_fields() {
  return {&StepTime::forward,
          &StepTime::backward,
          &StepTime::all_gather_wait,
          &StepTime::reduce_scatter_wait,
          &StepTime::optimizer,
          &StepTime::recompute,
          &StepTime::matmul,
          &StepTime::memory,
          &StepTime::copies,
          &StepTime::communication,
          &StepTime::other};
}

}  // namespace

StepTimeline::StepTimeline(const StepCosts* costs, std::vector<LayerCost> layer_costs, size_t units)
    : costs_(costs && costs->units.size() == units ? costs : nullptr), layers_(std::move(layer_costs)) {
  gather_ready_.assign(units, 0);
  reduce_ready_ = replicate_ready_ = gather_ready_;
  phase_ = &t_.forward;
}

void StepTimeline::compute(double seconds, double* kind) {
  compute_at_ += seconds;
  *phase_ += seconds;
  *kind += seconds;
}

void StepTimeline::wait(double until, double* phase) {
  if (until <= compute_at_) return;
  *phase += until - compute_at_;
  compute_at_ = until;
}

double StepTimeline::issue(double seconds) {
  t_.communication += seconds;
  if (costs_->communication_on_compute_cores) return issued_ += seconds;
  comm_at_ = std::max(compute_at_, comm_at_) + seconds;
  return comm_at_;
}

void StepTimeline::await(double ready, double* phase) {
  if (!costs_->communication_on_compute_cores) return wait(ready, phase);
  if (ready <= ran_) return;
  *phase += ready - ran_;
  compute_at_ += ready - ran_;
  ran_ = ready;
}

void StepTimeline::begin_pass(bool forward) {
  if (!on()) return;
  if (forward) pass_start_ = t_;
  phase_ = forward ? &t_.forward : &t_.backward;
}

void StepTimeline::issue_gather(int u) {
  if (on()) gather_ready_[static_cast<size_t>(u)] = issue(costs_->units[static_cast<size_t>(u)].gather);
}

void StepTimeline::gathered(int u) {
  if (!on()) return;
  await(gather_ready_[static_cast<size_t>(u)], &t_.all_gather_wait);
  compute(costs_->units[static_cast<size_t>(u)].copy_out, &t_.copies);
}

void StepTimeline::layer_forward(size_t l) {
  if (!on()) return;
  compute(layers_[l].forward_matmul, &t_.matmul);
  compute(layers_[l].forward_memory, &t_.memory);
}

void StepTimeline::layer_recompute(size_t l) {
  if (!on()) return;
  const double before = *phase_;
  layer_forward(l);
  t_.recompute += *phase_ - before;
}

void StepTimeline::layer_backward(size_t l) {
  if (!on()) return;
  compute(layers_[l].backward_matmul, &t_.matmul);
  compute(layers_[l].backward_memory, &t_.memory);
}

void StepTimeline::issue_reduce(int u) {
  if (!on()) return;
  const UnitCost& c = costs_->units[static_cast<size_t>(u)];
  compute(c.pack, &t_.copies);
  reduce_ready_[static_cast<size_t>(u)] = issue(c.reduce);
}

void StepTimeline::reduced(int u) {
  if (on()) await(reduce_ready_[static_cast<size_t>(u)], &t_.reduce_scatter_wait);
}

void StepTimeline::issue_replicate(int u) {
  if (on()) replicate_ready_[static_cast<size_t>(u)] = issue(costs_->units[static_cast<size_t>(u)].replicate);
}

void StepTimeline::replicated(int u) {
  if (on()) await(replicate_ready_[static_cast<size_t>(u)], &t_.reduce_scatter_wait);
}

void StepTimeline::unit_step(int u) {
  if (on()) compute(costs_->units[static_cast<size_t>(u)].optimizer, &t_.memory);
}

void StepTimeline::optimizer_step(bool clip, bool step_in_backward) {
  if (!on()) return;
  phase_ = &t_.optimizer;
  if (clip) compute(costs_->clip, &t_.memory);
  if (step_in_backward) return;
  for (const auto& c : costs_->units) compute(c.optimizer, &t_.memory);
}

void StepTimeline::end_pass(int64_t times) {
  if (!on()) return;
  for (auto field : pass_fields()) t_.*field += static_cast<double>(times - 1) * (t_.*field - pass_start_.*field);
  // The streams' clocks move on by the repeats too, so that the next pass starts after them.
  const double pass = compute_at_ - pass_start_.step;
  compute_at_ += static_cast<double>(times - 1) * pass;
  comm_at_ = std::max(comm_at_, compute_at_);
  t_.step = compute_at_;
}

StepTime StepTimeline::result() const {
  StepTime r = t_;
  if (!on()) return r;
  r.step = r.forward + r.backward + r.all_gather_wait + r.reduce_scatter_wait + r.optimizer + r.other;
  const double exposed = r.all_gather_wait + r.reduce_scatter_wait;
  const double memory = r.memory + r.copies;
  r.bound = r.matmul >= memory && r.matmul >= exposed ? "compute" : memory >= exposed ? "memory" : "communication";
  return r;
}

}  // namespace fsdpx
