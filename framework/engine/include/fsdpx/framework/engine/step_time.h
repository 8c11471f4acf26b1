// The time model of a step: the memory plan's replay of the engine's step (memory_plan.h, by the
// rules of step_order.h) carries a clock, so that one walk over the step gives its bytes and its
// time, with no second description of the step to drift from the first.
//
// Two streams: the compute stream (on the CPU, the host) runs each layer's forward and backward,
// a unit's copy-out after its all-gather and the packing of its gradients before its reduction,
// and the optimizer; the communication stream runs the collectives one after another, each
// starting once it is issued and the one before it has finished. The compute stream waits where
// the engine waits: for a unit's all-gather as the unit's forward or backward needs its
// parameters, for the reduction in flight as the next unit progresses (or the backward ends),
// for hybrid's all-reduce across replicas as the one after it starts. Those waits are the exposed
// communication, as StepClock (step_clock.h) measures them. Where the communication has no cores
// of its own (StepCosts::communication_on_compute_cores), it runs only in those waits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdpx/export.h"

namespace fsdpx {

// What one layer's forward and backward cost on the compute stream, in seconds: its matmuls,
// and its other ops (memory-bound).
struct LayerCost {
  std::string path;  // as LayerActivations::path; one no layer has goes to the unit it falls in
  double forward_matmul = 0, forward_memory = 0, backward_matmul = 0, backward_memory = 0;
};

// What one unit's collectives and copies cost per pass, in seconds.
struct UnitCost {
  double gather = 0;  // its all-gather on the communication stream (with an offloaded shard's copy)
  double copy_out = 0;  // on the compute stream once it arrived: the copy-out into the parameters
  double pack = 0;  // on the compute stream: its gradients packed for the reduction
  double reduce = 0;  // its reduction (reduce-scatter, or all-reduce unsharded; the sum of Gloo's all-to-all)
  double replicate = 0;  // hybrid: its all-reduce across replicas
  double optimizer = 0;  // the optimizer's step over its shard (inside backward with step_in_backward)
};

struct StepCosts {
  std::vector<LayerCost> layers;
  std::vector<UnitCost> units;  // in StepMemoryInput::units' order
  double clip = 0;  // clipping: the norm over every gradient shard and its all-reduce
  // The collectives run on the cores that compute (Gloo's threads, where the ranks' compute
  // threads take every core): a collective progresses only while the compute stream waits for
  // one, so that each one's time is exposed, in issue order.
  bool communication_on_compute_cores = false;
};

// A step's predicted seconds, in StepClock's phases (StepBreakdown), and what made them.
struct StepTime {
  double forward = 0, backward = 0, all_gather_wait = 0, reduce_scatter_wait = 0, optimizer = 0, other = 0;
  double step = 0;  // their sum
  double recompute = 0;  // of backward: the recomputed forwards
  double matmul = 0, memory = 0;  // of the compute stream's work: matmuls, and memory-bound ops
  double copies = 0;  // of it: the copy-outs and the packing around the collectives
  double communication = 0;  // the communication stream's busy time (exposed or hidden)
  // What bounds the step: "compute" (matmuls), "memory" (memory-bound ops, copies and the
  // optimizer), "communication" (the exposed waits), whichever is the largest share of the step.
  std::string bound;
  bool predicted() const { return step > 0; }
};

}  // namespace fsdpx
