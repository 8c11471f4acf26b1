// A unit's buffers by ParamGroup's rules: whether its parameters are gathered into storage of
// their own, the bytes of its all-gather and of its gathered parameters, and whether it reshards
// after forward. The engine's ParamGroup follows them, and the planners that replay the engine in
// bytes (run_plan, memory_plan) read them, so that a change is one edit. A unit's flat shard is
// padded_shard_numel (fsdpx/framework/base/shard_geometry.h) of its parameters' shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdpx/reshard_after_forward.h"
#include "fsdpx/export.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/sharding_strategy.h"

namespace fsdpx {

// Bytes of one element of `t`, signed as the byte counts are.
inline int64_t element_bytes(c10::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

// Gradient clipping squares a gradient shard at most this many elements at a time, in a double
// copy, so that the norm needs no double copy of a whole shard (at 1b width the root's would be
// 0.5 GiB per rank); the memory plan counts that copy at the optimizer step.
constexpr int64_t kGradNormChunk = int64_t{1} << 20;

// Whether the gathered parameters live in storage of their own: sharded over more than one rank,
// computed in another dtype than stored, or `offloads` (the shards stay in host memory, and every
// unit comes to the device, one rank's too). Otherwise they are the shards themselves. The one
// rule ParamGroup::separate(), the memory plan and the run plan follow.
FSDPX_API bool gathers_into_own_storage(int64_t shard_size, const PrecisionSpec& dtypes, bool offloads = false);

// The all-gather's output of a unit of `shard_numel` shard elements: every rank's shard in the
// compute dtype, but `float8_numel` of them in float8, one byte each (float8 all-gather); 0 when
// unsharded: nothing is gathered.
FSDPX_API int64_t all_gather_bytes(int64_t shard_numel, int64_t shard_size, const PrecisionSpec& dtypes,
                                   int64_t float8_numel = 0);

// The gathered parameters' storage, in the same dtypes (0 when they are the shards themselves:
// gathers_into_own_storage).
FSDPX_API int64_t gathered_bytes(int64_t shard_numel, int64_t shard_size, const PrecisionSpec& dtypes,
                                 int64_t float8_numel = 0, bool offloads = false);

// float8 all-gather (EngineOptions::float8_all_gather): whether a parameter of a unit whose linears
// compute in float8 is gathered in float8: the model reads it only as a linear's weight
// (`linear_weight`, from fsdpx::LinearWeights) and float8_eligible_shape accepts its shape.
FSDPX_API bool gathers_in_float8(bool linear_weight, const std::vector<int64_t>& shape);

// What float8 all-gather needs, checked where a run is planned and where an engine is built: a
// shard group of more than one rank, a model that declares fsdpx::LinearWeights
// (`model_lists_weights`), and at least one parameter gathered in float8 (`float8_params`).
// Throws fsdpx::Error naming what is missing and what would work.
FSDPX_API void check_float8_all_gather(int shard_size, bool model_lists_weights, int64_t float8_params);

// The size of the groups that hold a unit's parameters from its forward to its backward: the
// shard group's size S when it reshards after forward (the layout's choice, or `unit_choice` when
// set: the unit's own, EngineOptions::reshard_after_forward_by_unit), 1 when it keeps them
// gathered, k for a post-forward group (1 <= k <= S, dividing S: the engine checks).
// The root, and a layout over one rank, keep theirs: 1.
FSDPX_API int post_forward_group(const ShardingLayout& layout, bool root,
                                 std::optional<ReshardAfterForward> unit_choice = std::nullopt);
// Whether a unit whose post_forward_group is k keeps a part of its gathered parameters from
// forward to backward, 1/k of them, and gathers the rest over a group of k ranks: 1 < k < S and k
// divides S (k = S frees them all, k = 1 keeps them all).
FSDPX_API bool keeps_post_forward_part(int k, int shard_size);
// Whether the unit frees its gathered parameters after forward and gathers them (or, the int
// form, what it kept of them) again for backward: post_forward_group > 1. Over one rank, where
// nothing is gathered, a unit whose parameters are a copy of the shard (`own_storage`: mixed
// precision's compute dtype, or offloading's device copy) frees that copy after forward as the
// layout (or its own choice) says, and makes it again for backward, as FSDP2 frees its one-rank
// all-gather's output.
FSDPX_API bool reshards_after_forward(const ShardingLayout& layout, bool root,
                                      std::optional<ReshardAfterForward> unit_choice = std::nullopt,
                                      bool own_storage = false);

}  // namespace fsdpx
