// fsdpx/sharding_strategy.h: how parameters, gradients and optimizer state are split over ranks.
#pragma once

#include <string>

#include "fsdpx/component.h"
#include "fsdpx/error.h"
#include "fsdpx/export.h"
#include "fsdpx/topology.h"

namespace fsdpx {

// The layout a strategy chooses, for every unit. The world is shard_group_size x
// replicate_group_size ranks: each parameter is split (dim 0, padded) over a shard group and
// each shard group holds a full replica. Gradients are reduce-scattered within the shard group
// and, when replicate_group_size > 1, all-reduced across the replicate group.
//
//   full shard (ZeRO-3):  shard = world, replicate = 1, reshard_after_forward = true
//   shard_grad_op (ZeRO-2): shard = world, replicate = 1, reshard_after_forward = false
//   no shard (DDP):       shard = 1,     replicate = world (parameters stay whole)
//   hybrid shard:         shard = ranks per node, replicate = nodes
//   CPU offload:          any of the above with offload_to_cpu = true
struct ShardingLayout {
  int shard_group_size = 1;
  int replicate_group_size = 1;
  // Free the gathered parameters after forward and gather again for backward (true), or keep
  // them until the unit's backward is done (false).
  bool reshard_after_forward = true;
  // Keep sharded parameters, gradients and optimizer state in host memory; copy a unit's shards
  // to the device just before its all-gather and its reduced gradient shard back after.
  bool offload_to_cpu = false;
  // Whether the shards really move, the one place of this rule: when the compute device is the
  // CPU, offload has nothing to move and the run is its base strategy's.
  bool offloads(bool computes_on_cpu) const { return offload_to_cpu && !computes_on_cpu; }
};

class FSDPX_API ShardingStrategy {
 public:
  static constexpr Kind kKind = Kind::Sharding;
  virtual ~ShardingStrategy();

  // The layout for this topology. shard_group_size * replicate_group_size must equal
  // topology.world_size. Throws fsdpx::Error when the topology cannot host the strategy (for
  // example a world size not divisible by the requested shard size).
  virtual ShardingLayout layout(const Topology& topology) const = 0;
};

// Hybrid sharding's groups, the one place of the rule (hybrid_shard, and cpu_offload over it):
// shard groups of `shard_size` ranks (0: the ranks per node), replicated across the rest of the
// world. Throws fsdpx::Error naming `strategy` and the divisors of the world size when the size
// does not divide it.
inline ShardingLayout hybrid_layout(const Topology& t, int shard_size, bool reshard_after_forward,
                                    const std::string& strategy) {
  const int s = shard_size > 0 ? shard_size : t.local_world_size;
  if (s < 1 || t.world_size % s != 0) {
    std::string divisors;
    for (int d = 1; d <= t.world_size; ++d)
      if (t.world_size % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    throw Error(strategy + ": shard_size " + std::to_string(s) + (shard_size > 0 ? "" : " (the ranks per node)") +
                " does not divide the world size " + std::to_string(t.world_size) +
                "; set --sharding.shard_size to a divisor of " + std::to_string(t.world_size) + ": " + divisors);
  }
  return ShardingLayout{s, t.world_size / s, reshard_after_forward, /*offload_to_cpu=*/false};
}

}  // namespace fsdpx
