// Shard geometry: a tensor's rows (dim 0; a scalar is one row) and how they split over a shard
// group (FSDP2's padded dim-0 shards). The one place it is computed: the engine lays its shards
// out with it, and the planners, checkpoints and tests read it, so that a change to padding is
// one edit here.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdpx/export.h"

namespace fsdpx {

// Rows of a tensor of `shape`: its dim 0, or 1 for a scalar.
FSDPX_API int64_t rows_of(const std::vector<int64_t>& shape);
// Rows `t` holds: its dim 0, or 1 for a scalar.
FSDPX_API int64_t rows_of(const at::Tensor& t);
// Elements of one row of `shape` (the product of the dims after the first; 1 for a scalar).
FSDPX_API int64_t row_numel(const std::vector<int64_t>& shape);

// A tensor of `shape` over a shard group of `shard_size` ranks: each rank's share is
// rows_per_shard = ceil(rows / shard_size) rows (shard_numel elements), rank r's starting at row
// r * rows_per_shard; a share past the last row is padding (zeros that are never read back).
struct FSDPX_API ShardGeometry {
  ShardGeometry() = default;
  ShardGeometry(const std::vector<int64_t>& shape, int64_t shard_size);

  int64_t rows = 1;            // of the whole tensor
  int64_t row = 1;             // elements per row
  int64_t rows_per_shard = 1;  // every rank's share, padding included
  int64_t shard_numel = 1;     // rows_per_shard * row

  // The first row of rank `shard_rank`'s share.
  int64_t first_row(int64_t shard_rank) const { return shard_rank * rows_per_shard; }
  // Rows of that share that are real (the rest is padding): 0 to rows_per_shard.
  int64_t valid_rows(int64_t shard_rank) const;
};

// Elements of one rank's shards of tensors of `shapes`, each padded (the sum of their
// ShardGeometry::shard_numel): a unit's flat shard.
FSDPX_API int64_t padded_shard_numel(const std::vector<std::vector<int64_t>>& shapes, int64_t shard_size);

}  // namespace fsdpx
