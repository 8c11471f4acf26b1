#include "sharded_param.h"

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <ATen/ops/_has_compatible_shallow_copy_type.h>

#include "fsdpx/framework/runtime/memory_accounting.h"

namespace fsdpx {

void ShardedParam::lay_out(int64_t shard_size, int64_t at) {
  geometry = ShardGeometry(shape, shard_size);
  offset = at;
}

void ShardedParam::init_shard(Model& model, at::Generator gen, int shard_rank) const {
  at::NoGradGuard no_grad;
  // The whole parameter exists only for this moment.
  at::Tensor full = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  model.init_parameter(name, full, gen);
  const ShardGeometry& g = geometry;
  const int64_t mine = g.valid_rows(shard_rank);
  if (mine > 0)  // onto the shard's device (or host memory) from the CPU, where the values are drawn
    shard.view({g.rows_per_shard, g.row})
        .narrow(0, 0, mine)
        .copy_(full.reshape({g.rows, g.row}).narrow(0, g.first_row(shard_rank), mine));
}

void ShardedParam::attach() const {
  point_at(param, gathered);
  if (!float8_message.empty())
    param.unsafeGetTensorImpl()->release_storage_and_set_meta_custom_data_ptr_error_msg_(float8_message);
}

void point_at(const at::Tensor& param, const at::Tensor& data) {
  if (param.is_same(data) || at::_has_compatible_shallow_copy_type(param, data)) {
    param.set_data(data);
    return;
  }
  // LibTorch's check knows the dense backends by name (CPU, CUDA, ...), not PrivateUse1 (sim), so
  // it refuses moves between the CPU and sim. The same steps as set_data: a gradient accumulator
  // made for the old device goes, then the metadata (storage, sizes, device, dispatch keys) comes
  // from `data`; the autograd identity stays.
  const auto dense_cpu_or_sim = [](const at::Tensor& t) {
    return !t.is_sparse() && t.layout() == c10::kStrided && (t.device().is_cpu() || t.device().is_privateuseone());
  };
  TORCH_CHECK(dense_cpu_or_sim(param) && dense_cpu_or_sim(data), "parameter on ", param.device(),
              " cannot point at a tensor on ", data.device());
  if (torch::autograd::AutogradMeta* meta = torch::autograd::impl::get_autograd_meta(param)) {
    std::lock_guard<std::mutex> lock(meta->mutex_);
    meta->grad_accumulator_.reset();
  }
  param.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
}

void ShardedParam::release() const {
  param.unsafeGetTensorImpl()->release_storage_and_set_meta_custom_data_ptr_error_msg_(sharded_message);
}

void ShardedParam::show_local(const at::Tensor& grad) {
  point_at(param, local);
  param.mutable_grad() = shown_grad = grad;
}

void resize_storage(const c10::Storage& storage, size_t bytes) { resize_storage_bytes(storage, bytes); }

at::Tensor tensor_over(const c10::Storage& storage, int64_t offset, at::IntArrayRef sizes, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype).device(storage.device()));
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * sizes[i + 1];
  t.set_(storage, offset, sizes, strides);
  return t;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace fsdpx
