// fsdpx/checkpoint_backend.h: how sharded state is written and read back.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdpx/component.h"
#include "fsdpx/export.h"

namespace fsdpx {

// The rows [row_offset, row_offset + local.size(0)) of a logical tensor of shape global_shape,
// held by this rank (dim-0 sharding; a replicated tensor has row_offset 0 and all rows).
struct TensorShard {
  std::string name;
  at::Tensor local;
  std::vector<int64_t> global_shape;
  int64_t row_offset = 0;
};

// What one rank saves or fills in on load.
struct CheckpointState {
  int64_t step = 0;
  std::vector<TensorShard> tensors;  // parameters and optimizer state, by unique name
  std::string trainer_state_json;    // RNG, data position, ...
  std::string config_ini;            // the resolved configuration the run was started with
};

// The ranks taking part, and a barrier across them.
struct CheckpointContext {
  int rank = 0;
  int world_size = 1;
  std::function<void()> barrier;
  // ABI 1.1 (appended; the host fills them):
  // Sums `values` element-wise over every rank, in place. Collective.
  std::function<void(std::vector<int64_t>& values)> all_sum;
  // The whole tensor of `shard` on rank 0 (an undefined tensor elsewhere), gathered from every
  // rank's rows. Collective: every rank calls it for the same tensor, in the same order.
  std::function<at::Tensor(const TensorShard& shard)> gather_to_rank0;
  // False on the ranks whose shards are a second copy (the replicas of hybrid sharding): they
  // hold the same rows as a primary rank, which alone writes and counts them.
  bool primary = true;
};

class FSDPX_API CheckpointBackend {
 public:
  static constexpr Kind kKind = Kind::Checkpoint;
  virtual ~CheckpointBackend();

  // Writes `state` under `dir` so that an interrupted save never looks complete. Collective:
  // every rank calls it with its own shards.
  virtual void save(const std::string& dir, const CheckpointState& state,
                    const CheckpointContext& ctx) = 0;
  // Fills each of `state.tensors` (already allocated with this rank's layout, which may differ
  // from the saved one) and the scalar fields from `dir`. Collective.
  virtual void load(const std::string& dir, CheckpointState& state,
                    const CheckpointContext& ctx) = 0;
  // The newest complete checkpoint under `root`, if any.
  virtual std::optional<std::string> latest(const std::string& root) const = 0;
};

}  // namespace fsdpx
