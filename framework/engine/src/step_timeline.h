// The clock the memory plan's replay carries (step_time.h): the compute and communication streams'
// times, advanced at the replay's events.
#pragma once

#include <vector>

#include "fsdpx/framework/engine/step_time.h"

namespace fsdpx {

class StepTimeline {
 public:
  // `layer_costs[l]`: the cost of the replay's layer l; `costs->units`: one per unit (null costs,
  // or another count of units: no time predicted, every call a no-op).
  StepTimeline(const StepCosts* costs, std::vector<LayerCost> layer_costs, size_t units);
  bool on() const { return costs_ != nullptr; }

  void begin_pass(bool forward);  // the phase the compute stream's work falls in
  void issue_gather(int u);  // its all-gather starts on the communication stream
  void gathered(int u);  // the compute stream needs it: waits, then copies out
  void layer_forward(size_t l);
  void layer_recompute(size_t l);  // a recomputed layer's forward, inside backward
  void layer_backward(size_t l);
  void issue_reduce(int u);
  void reduced(int u);  // the compute stream waits for the reduction
  void issue_replicate(int u);
  void replicated(int u);
  void unit_step(int u);  // the optimizer's step over one unit's shard, inside backward
  void optimizer_step(bool clip, bool step_in_backward);
  // The pass that just ran stands for `times` passes of the step (unsynchronised micro-batches
  // repeat the first one's time).
  void end_pass(int64_t times);

  StepTime result() const;

 private:
  void compute(double seconds, double* kind);
  void wait(double until, double* phase);
  // On the communication stream: when it will be finished; on the compute cores, how much
  // communication must have run by then.
  double issue(double seconds);
  void await(double ready, double* phase);  // the compute stream waits for an issued collective

  const StepCosts* costs_;
  std::vector<LayerCost> layers_;
  std::vector<double> gather_ready_, reduce_ready_, replicate_ready_;
  double compute_at_ = 0, comm_at_ = 0;  // when each stream is free
  double issued_ = 0, ran_ = 0;  // on the compute cores: communication issued, and run
  double* phase_ = nullptr;  // forward or backward
  StepTime t_, pass_start_;
};

}  // namespace fsdpx
