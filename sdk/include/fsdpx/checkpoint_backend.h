// fsdpx/checkpoint_backend.h: how sharded state is written and read back.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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

// ABI 1.x, appended: a save in its parts, for a save whose writing leaves the training thread
// (fsdpx-train's --checkpoint.async). StreamedCheckpointBackend::begin_save prepares it on the
// training thread; then one thread, any one, hands over this rank's rows of each tensor it
// writes, in layout order and a buffer at a time, and finishes.
class FSDPX_API CheckpointWriter {
 public:
  virtual ~CheckpointWriter();
  // Whether this rank writes tensor `i` of the layout the save was begun with.
  virtual bool writes(size_t i) const = 0;
  // The next `rows` of this rank's rows of tensor `i` (from its first, in order), as host bytes
  // laid out contiguously in the tensor's dtype. Local; throws fsdpx::Error naming the file.
  virtual void write_rows(size_t i, const void* bytes, int64_t rows) = 0;
  // After the last row, or after a failure (`error`: why this rank could not stage or write,
  // else ""): this rank's files fsynced, every rank's outcome agreed over `ctx` (which may be
  // another group than the one the save was begun with), then rank 0 makes the checkpoint
  // complete, or no rank does. Collective over `ctx`. Throws fsdpx::Error when any rank failed.
  virtual void finish(const CheckpointContext& ctx, const std::string& error) = 0;
};

// Optional capability of a CheckpointBackend (found with dynamic_cast): saves staged into a
// bounded pool of host memory, tensor by tensor, and written from it, while training goes on
// when saves_in_background().
class FSDPX_API StreamedCheckpointBackend {
 public:
  virtual ~StreamedCheckpointBackend();
  // The backend's option: whether a save writes in the background (the step waits only while
  // the state is staged), or the step waits until it is written.
  virtual bool saves_in_background() const = 0;
  // The bytes of host memory a save stages through, at most (its option).
  virtual int64_t staging_bytes() const = 0;
  // A save of `layout` under `dir`, begun: the names, dtypes, shapes and this rank's rows of its
  // tensors, its step, trainer state and configuration are taken; the tensors' values are not
  // read. Collective over `ctx`; throws fsdpx::Error on every rank when one cannot begin.
  virtual std::unique_ptr<CheckpointWriter> begin_save(const std::string& dir, const CheckpointState& layout,
                                                       const CheckpointContext& ctx) = 0;
};

}  // namespace fsdpx
