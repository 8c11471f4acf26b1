#include "unit_collectives.h"

#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdpx {

at::Tensor cast_for_all_gather(const at::Tensor& flat_shard, at::ScalarType compute, c10::Device device) {
  return flat_shard.to(device, compute, /*non_blocking=*/true);  // itself when already there
}

void copy_out_gathered(at::Tensor& unsharded_flat, const at::Tensor& gathered, const std::vector<ShardedParam>& params,
                       int64_t s) {
  at::NoGradGuard no_grad;
  for (const ShardedParam& p : params) {
    const int64_t n = p.geometry.shard_numel;
    unsharded_flat.narrow(0, s * p.offset, s * n).view({s, n}).copy_(gathered.narrow(1, p.offset, n));
  }
}

at::Tensor pack_gradients(std::vector<ShardedParam>& params, int64_t s, int64_t total,
                          const at::TensorOptions& options) {
  at::NoGradGuard no_grad;
  at::Tensor packed = at::zeros({s * total}, options);
  at::Tensor dst = packed.view({s, total});
  for (ShardedParam& p : params) {
    at::Tensor g = p.param.grad();
    if (!g.defined()) continue;
    at::Tensor flat = g.reshape({-1});
    const ShardGeometry& geo = p.geometry;
    for (int64_t r = 0; r < s; ++r) {
      const int64_t rows = geo.valid_rows(r);
      if (rows <= 0) break;
      dst[r].narrow(0, p.offset, rows * geo.row).copy_(flat.narrow(0, geo.first_row(r) * geo.row, rows * geo.row));
    }
    p.param.mutable_grad() = at::Tensor();
  }
  return packed;
}

}  // namespace fsdpx
