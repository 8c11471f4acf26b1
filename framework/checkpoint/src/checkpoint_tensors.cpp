// A checkpoint's tensors: which rank writes a tensor's rows, rows as bytes, the tensor a load reads into.
#include "checkpoint_tensors.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/suggest.h"

namespace fsdpx::ckpt {

int64_t row_bytes_of(const std::vector<int64_t>& shape, c10::ScalarType t) {
  return row_numel(shape) * static_cast<int64_t>(c10::elementSize(t));
}

// Whether this rank writes (and counts in digests) its rows of `t`: the first replica alone, and
// a tensor held whole by every rank (a replicated scalar) only by rank 0.
bool owns(const TensorShard& t, const CheckpointContext& ctx) {
  const int64_t local = rows_of(t.local);
  if (local == 0 || !ctx.primary) return false;
  return local < rows_of(t.global_shape) || ctx.rank == 0;
}

at::Tensor bytes_to_tensor(std::vector<char>& bytes, const std::vector<int64_t>& shape, int64_t rows,
                           c10::ScalarType t) {
  std::vector<int64_t> s = shape.empty() ? std::vector<int64_t>{} : shape;
  if (!s.empty()) s[0] = rows;
  return at::from_blob(bytes.data(), s, at::TensorOptions().dtype(t)).clone();
}

at::Tensor receiving_tensor(const at::Tensor& local, c10::ScalarType saved) {
  if (local.scalar_type() == saved && local.is_contiguous()) return local;
  return at::empty(local.sizes(), local.options().dtype(saved).memory_format(at::MemoryFormat::Contiguous));
}

void finish_load(at::Tensor& local, const at::Tensor& received) {
  if (!received.is_same(local)) local.copy_(received);  // casts when the run stores another dtype
}

std::string missing_tensor_question(const std::string& name, const std::vector<std::string>& held) {
  const auto moved = moved_name(name, held);
  return moved ? " but holds '" + *moved + "': was it saved by an older version of the model, or saved from another "
               : "; was it saved from another ";
}

}  // namespace fsdpx::ckpt
