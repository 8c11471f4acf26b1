// A checkpoint's tensors: the optimizer's names, which rank writes a tensor's rows, rows as bytes.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdpx/checkpoint_backend.h"

namespace fsdpx::ckpt {

constexpr const char* kOptimPrefix = "optim/";

// Rows (rows_of) and elements per row: fsdpx/framework/base/shard_geometry.h.
int64_t row_bytes_of(const std::vector<int64_t>& shape, c10::ScalarType t);

// Whether this rank writes (and counts in digests) its rows of `t`: the first replica alone, and
// a tensor held whole by every rank (a replicated scalar) only by rank 0.
bool owns(const TensorShard& t, const CheckpointContext& ctx);

at::Tensor bytes_to_tensor(std::vector<char>& bytes, const std::vector<int64_t>& shape, int64_t rows,
                           c10::ScalarType t);
// Where a load reads `local`'s rows saved as `saved`: `local` itself when it is contiguous and of
// that dtype (no copy), else a new tensor that finish_load then casts into `local`.
at::Tensor receiving_tensor(const at::Tensor& local, c10::ScalarType saved);
void finish_load(at::Tensor& local, const at::Tensor& received);

}  // namespace fsdpx::ckpt
