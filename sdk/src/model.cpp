// The SDK's model helpers (fsdpx/model.h): deferred parameters and next-token batches.
#include <ATen/ops/empty.h>

#include "fsdpx/model.h"

namespace fsdpx {

at::Tensor deferred_tensor(at::IntArrayRef shape) {
  at::Tensor t = at::empty({0}, at::kFloat);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(shape);  // sizes only
  // No storage at all: reading it is an error that says why, not a read past an empty storage.
  impl->release_storage_and_set_meta_custom_data_ptr_error_msg_(
      "a parameter of shape " + c10::str(shape) +
      " made by fsdpx::deferred_tensor has no memory until a ShardingEngine takes its model (which fills it through "
      "Model::init_parameter); read it only inside the engine's forward");
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
