// A checkpoint's tensors: the optimizer's names, which rank writes a tensor's rows, rows as bytes.
#pragma once

#include <cstdint>
#include <string>
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

// What a load says of a tensor `name` that the checkpoint lacks, after "has no tensor 'name'":
// where `held` has it under a name moved into a module or out of one (suggest.h's moved_name),
// " but holds 'x': was it saved by an older version of the model, or saved from another ", else
// "; was it saved from another " (the caller names what: model, optimizer or precision).
std::string missing_tensor_question(const std::string& name, const std::vector<std::string>& held);

}  // namespace fsdpx::ckpt
