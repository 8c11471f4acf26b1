// The SDK's model helpers (fsdpx/model.h): deferred parameters and next-token batches.
#include <ATen/ops/empty.h>

#include "fsdpx/model.h"

namespace fsdpx {

at::Tensor deferred_tensor(at::IntArrayRef shape) {
  at::Tensor t = at::empty({0}, at::kFloat);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);  // sizes only; the storage stays empty
  return t;
}

Batch next_token_batch(const at::Tensor& sequences) {
  const int64_t t = sequences.size(1) - 1;
  Batch b;
  b.inputs = sequences.narrow(1, 0, t).contiguous();
  b.targets = sequences.narrow(1, 1, t).contiguous();
  b.samples = sequences.size(0);
  b.tokens = b.samples * t;
  return b;
}

}  // namespace fsdpx
