// What a unit asks of its engine during a step, and where the step is (FSDP2's TrainingState).
// A unit (sharding_unit.h) sees this narrow context, not the whole engine: ShardingEngine::Impl
// implements it (engine_state.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "engine_config.h"

namespace fsdpx {

struct ParamGroup;
struct Unit;

// Where the engine is in a step.
enum class TrainingState {
  Idle,              // between steps: a forward may start
  Forward,           // in ShardingEngine::forward
  AwaitingBackward,  // the forward's output needs a backward, which has reached no unit yet
  Backward,          // a backward reached a unit and has not finished
};

class StepContext {
 public:
  virtual ~StepContext() = default;

  // The engine's process-unique id (what autograd nodes and hooks keep: live_unit), and the
  // current forward's generation.
  virtual int64_t engine_id() const = 0;
  virtual uint64_t generation() const = 0;
  virtual const EngineConfig& engine_config() const = 0;
  // Throws fsdpx::Error unless `gen` is the current forward's and its backward has not finished.
  virtual void check_generation(uint64_t gen, const std::string& unit) const = 0;

  // `u`'s forward began: it joins this forward's order.
  virtual void forward_began(Unit& u) = 0;
  // With overlap: issues the gathers of the units after `u` in the last forward's order (reversed
  // in backward) that still need one.
  virtual void prefetch_after(Unit& u, bool backward) = 0;
  // A backward reached its first unit of generation `gen`: -> Backward, and the backward's end
  // (finish_backward) queued with autograd.
  virtual void backward_began(uint64_t gen) = 0;
  // Activation offload (activation_offload.h). `sources` are a unit's inputs whose copies to host
  // memory were just issued: they are kept until release_offloading, which the next unit's
  // offload and the forward's end call: the compute stream waits for the copies, and they go.
  virtual void offload_issued(std::vector<at::Tensor> sources) = 0;
  virtual void release_offloading() = 0;
  // `u`'s backward begins: its offloaded inputs, and the next unit's in backward order, come back.
  virtual void load_offloaded(Unit& u) = 0;
  // Waits for the reduction in flight (hybrid: then issues its all-reduce across replicas).
  virtual void finish_in_flight_reduce() = 0;
  // `g`'s gradients are complete: its reduction is issued after the one in flight, unless
  // gradient synchronisation is off (accumulation).
  virtual void reduce(ParamGroup& g) = 0;
};

}  // namespace fsdpx
