// float8 all-gather's side of a unit (EngineOptions::float8_all_gather; torchao's
// WeightWithDynamicFloat8CastTensor under FSDP2). Each rank's row of the unit's all-gather holds
// its shards of the parameters gathered in the compute dtype, then, one byte each, those gathered
// in e4m3, cast on the shard with this step's scale. After the all-gather the first go to the
// unit's unsharded storage, the others to a storage of e4m3 weights, which fsdpx::linear reads
// (fsdpx::Float8GatheredWeight); those parameters' module tensors hold no data inside the step.
#pragma once

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include "fsdpx/float8.h"
#include "sharded_param.h"

namespace fsdpx {

struct ParamGroup;

struct Float8Gather {
  // Per parameter of the unit: its gathered weight (null: gathered in the compute dtype), and its
  // shard's element offset in its part of the row.
  std::vector<std::shared_ptr<Float8GatheredWeight>> weights;
  std::vector<int64_t> at;
  int64_t compute_numel = 0, float8_numel = 0;  // one rank's elements in each part of the row
  c10::Storage storage;  // the gathered e4m3 weights: shard_size * float8_numel bytes while gathered
  at::Tensor flat;  // over `storage`, for the copy-out
  std::vector<std::shared_ptr<void>> registered;  // fsdpx::linear finds the weights while these live
  // This unit's float8 weights' scales, in order, for the casts before its all-gathers: a copy read
  // by the copy-in stream alone, as the weights' own are read by the compute stream alone (no
  // block of memory two streams use without an order between them).
  at::Tensor cast_scales;

  bool on() const { return float8_numel > 0; }
  // The bytes of one rank's row.
  int64_t row_bytes(at::ScalarType compute) const;

  // Lays the row out for `params` (float8[i]: parameter i is gathered in float8) of a unit whose
  // shard group has `shard_size` ranks, and allocates `storage` on `device`, full (the caller
  // frees it once the views are made).
  void lay_out(const std::vector<ShardedParam>& params, const std::vector<bool>& float8, int64_t shard_size,
               c10::Device device);
  // What parameter i's module tensor points at while gathered, over `unsharded` (the compute
  // part, laid out as `at` says); for a parameter gathered in float8, its metadata over no bytes,
  // with its Float8GatheredWeight registered and its float8_message set.
  at::Tensor gathered_view(size_t i, ShardedParam& p, const c10::Storage& unsharded, int64_t shard_size,
                           at::ScalarType compute);
  // The all-gather's input: this rank's row on `device`, from the flat shard (fp32, on the device
  // or in host memory), the float8 parameters cast with their weights' scales.
  at::Tensor input(const at::Tensor& flat_shard, const std::vector<ShardedParam>& params, at::ScalarType compute,
                   c10::Device device) const;
  // Copies the all-gather's output ([shard_size, row] bytes: every rank's row, in rank order) out:
  // the compute part into `unsharded_flat`, the float8 part into `storage`, each parameter's rows
  // contiguous. Both storages have their bytes.
  void copy_out(at::Tensor& unsharded_flat, const at::Tensor& gathered, const std::vector<ShardedParam>& params,
                int64_t shard_size, at::ScalarType compute) const;
};

// Sets the scale of every weight `groups` gather in float8 from its amax over the whole weight:
// each rank's amaxes of its shards, all-reduced (max) over the shard group in one collective, as
// torchao's precompute_float8_dynamic_scale_for_fsdp. Before each forward, when the shards hold
// what the optimizer last wrote. A no-op when no group gathers in float8.
void set_float8_scales(const std::vector<ParamGroup*>& groups);

}  // namespace fsdpx
