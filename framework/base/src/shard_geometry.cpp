#include "fsdpx/framework/base/shard_geometry.h"

#include <algorithm>

namespace fsdpx {

int64_t rows_of(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape[0]; }

int64_t rows_of(const at::Tensor& t) { return t.dim() == 0 ? 1 : t.size(0); }

int64_t row_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

ShardGeometry::ShardGeometry(const std::vector<int64_t>& shape, int64_t shard_size)
    : rows(rows_of(shape)), row(row_numel(shape)) {
  rows_per_shard = rows == 0 ? 0 : (rows + shard_size - 1) / shard_size;
  shard_numel = rows_per_shard * row;
}

int64_t ShardGeometry::valid_rows(int64_t shard_rank) const {
  return std::clamp<int64_t>(rows - first_row(shard_rank), 0, rows_per_shard);
}

int64_t padded_shard_numel(const std::vector<std::vector<int64_t>>& shapes, int64_t shard_size) {
  int64_t n = 0;
  for (const auto& shape : shapes) n += ShardGeometry(shape, shard_size).shard_numel;
  return n;
}

}  // namespace fsdpx
