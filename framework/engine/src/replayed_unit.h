// A unit's buffers in the memory plan's replay of a step (memory_plan.cpp), by ParamGroup's
// rules: the gathered storage and the all-gather's output from unit_buffers.h, the rest as
// ParamGroup's collectives allocate them.
#pragma once

#include <cstdint>
#include <string>

#include "fsdpx/framework/engine/memory_plan.h"
#include "fsdpx/framework/engine/unit_buffers.h"

namespace fsdpx {

// One unit's buffers, in bytes.
struct ReplayedUnit {
  std::string name;  // "unit layers.3", "the root"
  int64_t gathered = 0;  // the unsharded storage (0: the parameters are the shard itself)
  int64_t gather_out = 0;  // the all-gather's output, until the copy-out
  int64_t gather_in = 0;  // the shard cast to the compute dtype, while gathering
  int64_t grad_elements = 0;  // of its trainable parameters
  int64_t grad_shard = 0;  // the flat gradient shard
  int64_t packed = 0;  // the reduction's input
  int64_t received = 0;  // the all-to-all's receive buffer (Gloo)
  int64_t reduce_out = 0;  // the reduction's output, when not the gradient shard itself
  int64_t exchange = 0;  // deterministic: the all-to-all's input of world x shard elements
  bool reshard_after_forward = false;
  int64_t post_forward = 0;  // the post-forward part: what a post-forward group keeps from forward to backward
  bool recompute = false;
  bool offload = false;  // activation offload: the recomputed input leaves in forward
};

ReplayedUnit replayed_unit(const UnitMemory& u, bool root, const StepMemoryInput& in);

// Unsharded and replicated with the gradient shards in host memory: the all-reduce across the
// replicas runs on a device buffer, in flight until the next unit's reduction (ParamGroup).
bool averages_on_device(const StepMemoryInput& in);

// A gradient shard kept in a lower dtype than its parameter (bf16_mixed's keep_low_precision_grads)
// is widened one parameter shard at a time for the optimizer's kernel: the largest of `u`'s (in
// host memory when offloading).
int64_t widened_gradient(const UnitMemory& u, const StepMemoryInput& in);

}  // namespace fsdpx
