#include "unit_collectives.h"

#include <algorithm>

#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdpx {

at::Tensor cast_for_all_gather(const at::Tensor& flat_shard, at::ScalarType compute, c10::Device device) {
  return flat_shard.to(device, compute, /*non_blocking=*/true);  // itself when already there
}

void copy_out_gathered(at::Tensor& unsharded_flat, const at::Tensor& gathered, const std::vector<ShardedParam>& params,
                       int64_t s) {
  at::NoGradGuard no_grad;
  for (const ShardedParam& p : params)
    unsharded_flat.narrow(0, s * p.offset, s * p.shard_numel)
        .view({s, p.shard_numel})
        .copy_(gathered.narrow(1, p.offset, p.shard_numel));
}

at::Tensor pack_gradients(std::vector<ShardedParam>& params, int64_t s, int64_t total, const at::TensorOptions& options) {
  at::NoGradGuard no_grad;
  at::Tensor packed = at::zeros({s * total}, options);
  at::Tensor dst = packed.view({s, total});
  for (ShardedParam& p : params) {
    at::Tensor g = p.param.grad();
    if (!g.defined()) continue;
    at::Tensor flat = g.reshape({-1});
    for (int64_t r = 0; r < s; ++r) {
      const int64_t rows = std::min(p.rows_per_shard, p.d0 - r * p.rows_per_shard);
      if (rows <= 0) break;
      dst[r].narrow(0, p.offset, rows * p.row).copy_(flat.narrow(0, r * p.rows_per_shard * p.row, rows * p.row));
    }
    p.param.mutable_grad() = at::Tensor();
  }
  return packed;
}

}  // namespace fsdpx
