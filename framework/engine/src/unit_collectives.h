// The tensor work around a unit's collectives (FSDP2's _fsdp_collectives): what goes into the
// all-gather and how its output becomes the parameters, and how the parameters' gradients become
// the reduce-scatter's input.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "sharded_param.h"

namespace fsdpx {

// The all-gather input: the flat shard in the compute dtype on `device` (cast before the
// collective, so a bf16 compute dtype halves the bytes on the wire; copied there when the shard
// lives in host memory). The shard itself when it already is both.
at::Tensor cast_for_all_gather(const at::Tensor& flat_shard, at::ScalarType compute, c10::Device device);

// Copies `gathered` ([shard_size, total]: every rank's flat shard in rank order) into
// `unsharded_flat`, parameter by parameter, so that each parameter's rows are contiguous:
// parameter p occupies [shard_size * p.offset, shard_size * (p.offset + p.geometry.shard_numel)).
void copy_out_gathered(at::Tensor& unsharded_flat, const at::Tensor& gathered, const std::vector<ShardedParam>& params,
                       int64_t shard_size);

// The reduce-scatter input ([shard_size * total] in `options`' dtype, zeros where a parameter has
// no gradient or its share is padding): each parameter's unsharded gradient split by rows into
// the ranks' slices. The parameters' gradients are released.
at::Tensor pack_gradients(std::vector<ShardedParam>& params, int64_t shard_size, int64_t total,
                          const at::TensorOptions& options);

}  // namespace fsdpx
