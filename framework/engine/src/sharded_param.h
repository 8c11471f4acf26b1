// ShardedParam: one parameter of a unit, split over the shard group by rows (dim 0), padded to
// equal shares (FSDP2's FSDPParam). Its module tensor keeps its identity: set_data points it at
// a view of the unit's unsharded storage while the unit is gathered (or of the shard itself when
// nothing is gathered), and, between steps, at this rank's rows of the shard (`local`), with
// their gradient as its .grad, so that an optimizer over module->parameters() steps the shards,
// as FSDP2's parameters are DTensor shards outside forward and backward.
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

// What a read of a module tensor whose unit is sharded says, after the parameter's name: the
// engine's forward words that error in one line, without LibTorch's backtrace.
inline constexpr const char* kNotGatheredHere = "is not gathered here";

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
  // float8 all-gather: gathered in float8 only (fsdpx::Float8GatheredWeight), so that `gathered`
  // is its shape and compute dtype over no bytes, and reading `param` while gathered gives this.
  std::string float8_message;
  // This rank's rows of `shard` without the padding: what `param` is between steps (its shape
  // is the parameter's with dim 0 this rank's valid rows, 0 on a rank past the last row).
  at::Tensor local;
  // Between steps, the unsharded gradient autograd accumulated into `param` in backwards without
  // gradient sync (micro-batches), kept here while `param` shows `local` and given back to it at
  // the next forward (FSDP2's unsharded_accumulated_grad).
  at::Tensor unsharded_grad;
  at::Tensor shown_grad;  // what show_local set as `param`'s .grad, to see what an optimizer changed

  // Points the module's tensor at `gathered` (gathered in float8: its metadata, with no storage).
  void attach() const;
  // Drops the module's tensor's storage: reading it (until attach) throws c10::Error with
  // sharded_message, instead of reading past the end of a freed storage.
  void release() const;
  // Points the module's tensor at `local`, and its .grad at `grad` (this rank's gradient rows,
  // undefined when none are held).
  void show_local(const at::Tensor& grad);

  // Sets the geometry for a shard group of `shard_size` ranks, placed at `offset`.
  void lay_out(int64_t shard_size, int64_t offset);
  // Fills this rank's rows of the shard from the whole parameter, created alone from `gen`
  // through `model` (the same values at every world size).
  void init_shard(Model& model, at::Generator gen, int shard_rank) const;
};

// param.set_data(data), also for moves between the CPU and a device LibTorch does not list among
// the dense backends it checks (PrivateUse1: sim): a deferred parameter's first move there, and
// an offloaded shard's rows in host memory between steps.
void point_at(const at::Tensor& param, const at::Tensor& data);

// Resizes a storage of the engine's device to `bytes` (0 frees it; the storage object stays).
void resize_storage(const c10::Storage& storage, size_t bytes);

// A tensor of `sizes` (contiguous) over `storage` from element `offset`, with its own version
// counter, so that refilling the storage never trips autograd's check on tensors it saved.
at::Tensor tensor_over(const c10::Storage& storage, int64_t offset, at::IntArrayRef sizes, at::ScalarType dtype);

int64_t numel_of(const std::vector<int64_t>& shape);

}  // namespace fsdpx
