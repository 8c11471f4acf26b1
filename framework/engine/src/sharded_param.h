// ShardedParam: one parameter of a unit, split over the shard group by rows (dim 0), padded to
// equal shares (FSDP2's FSDPParam). Its module tensor keeps its identity: set_data points it at
// a view of the unit's unsharded storage (or of the shard itself when nothing is gathered).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/Generator.h>
#include <c10/core/Storage.h>

#include "fsdpx/framework/base/dtype_name.h"  // shape_text
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/model.h"

namespace fsdpx {

struct ShardedParam {
  std::string name;
  at::Tensor param;  // the module's registered parameter; its data is swapped, never the object
  std::vector<int64_t> shape;
  // Its rows over the shard group (fsdpx/framework/base/shard_geometry.h); this rank's share
  // lies at `offset` in the unit's flat shard.
  ShardGeometry geometry;
  int64_t offset = 0;
  at::Tensor shard;  // leaf [geometry.rows_per_shard, ...] over the unit's flat shard
  // What `param` is while the unit is gathered: a view of the unit's unsharded storage (or of the
  // shard itself, when nothing is gathered).
  at::Tensor gathered;
  std::string sharded_message;  // the error reading `param` gives while the unit is sharded

  // Points the module's tensor at `gathered`.
  void attach() const;
  // Drops the module's tensor's storage: reading it (until attach) throws c10::Error with
  // sharded_message, instead of reading past the end of a freed storage.
  void release() const;

  // Sets the geometry for a shard group of `shard_size` ranks, placed at `offset`.
  void lay_out(int64_t shard_size, int64_t offset);
  // Fills this rank's rows of the shard from the whole parameter, created alone from `gen`
  // through `model` (the same values at every world size).
  void init_shard(Model& model, at::Generator gen, int shard_rank) const;
};

// param.set_data(data), also for the first move of a CPU (deferred) parameter to a device LibTorch
// does not list among the dense backends it checks (PrivateUse1: sim).
void point_at(const at::Tensor& param, const at::Tensor& data);

// Resizes a storage of the engine's device to `bytes` (0 frees it; the storage object stays).
void resize_storage(const c10::Storage& storage, size_t bytes);

// A tensor of `sizes` (contiguous) over `storage` from element `offset`, with its own version
// counter, so that refilling the storage never trips autograd's check on tensors it saved.
at::Tensor tensor_over(const c10::Storage& storage, int64_t offset, at::IntArrayRef sizes, at::ScalarType dtype);

int64_t numel_of(const std::vector<int64_t>& shape);

}  // namespace fsdpx
