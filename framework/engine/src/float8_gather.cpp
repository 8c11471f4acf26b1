#include "float8_gather.h"

#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/stack.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/framework/runtime/collective_context.h"
#include "fsdpx/framework/runtime/device.h"
#include "param_group.h"

namespace fsdpx {

int64_t Float8Gather::row_bytes(at::ScalarType compute) const {
  return compute_numel * static_cast<int64_t>(c10::elementSize(compute)) + float8_numel;
}

void Float8Gather::lay_out(const std::vector<ShardedParam>& params, const std::vector<bool>& float8, int64_t shard_size,
                           c10::Device device) {
  weights.assign(params.size(), nullptr);
  at.assign(params.size(), 0);
  compute_numel = float8_numel = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].geometry.shard_numel;
    if (float8[i]) {
      weights[i] = std::make_shared<Float8GatheredWeight>();
      at[i] = float8_numel;
      float8_numel += n;
    } else {
      at[i] = compute_numel;
      compute_numel += n;
    }
  }
  storage = c10::Storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(shard_size * float8_numel),
                         c10::GetAllocator(device.type()), /*resizable=*/true);
  flat = tensor_over(storage, 0, {shard_size * float8_numel}, at::kFloat8_e4m3fn);
}

at::Tensor Float8Gather::gathered_view(size_t i, ShardedParam& p, const c10::Storage& unsharded, int64_t shard_size,
                                       at::ScalarType compute) {
  if (!weights[i]) return tensor_over(unsharded, shard_size * at[i], p.shape, compute);
  weights[i]->data = tensor_over(storage, shard_size * at[i], p.shape, at::kFloat8_e4m3fn);
  registered.push_back(register_float8_gathered(p.param, weights[i]));
  p.float8_message = "parameter '" + p.name + "' " + kNotGatheredHere +
                     " in its compute dtype: its unit gathers it in float8 (--precision.float8_all_gather), for "
                     "fsdpx::linear alone, and the model lists it among its linear weights (fsdpx::LinearWeights); a "
                     "model that reads it otherwise needs float8_all_gather false";
  // The module tensor's shape and dtype while gathered; the bytes go at once (attach drops them).
  c10::Storage own(c10::Storage::use_byte_size_t(), static_cast<size_t>(numel_of(p.shape)) * c10::elementSize(compute),
                   c10::GetAllocator(unsharded.device().type()), /*resizable=*/true);
  at::Tensor meta = tensor_over(own, 0, p.shape, compute);
  resize_storage(own, 0);
  return meta;
}

at::Tensor Float8Gather::input(const at::Tensor& flat_shard, const std::vector<ShardedParam>& params,
                               at::ScalarType compute, c10::Device device) const {
  at::NoGradGuard no_grad;
  const int64_t es = static_cast<int64_t>(c10::elementSize(compute));
  at::Tensor row = at::empty({row_bytes(compute)}, at::TensorOptions().dtype(at::kByte).device(device));
  int64_t next_scale = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].geometry.shard_numel;
    const at::Tensor shard = flat_shard.narrow(0, params[i].offset, n);
    if (weights[i]) {
      row.narrow(0, compute_numel * es + at[i], n)
          .view(at::kFloat8_e4m3fn)
          .copy_(to_float8(shard.to(device, /*non_blocking=*/true), cast_scales[next_scale++], at::kFloat8_e4m3fn));
    } else {
      row.narrow(0, at[i] * es, n * es).view(compute).copy_(shard, /*non_blocking=*/true);
    }
  }
  return row;
}

void Float8Gather::copy_out(at::Tensor& unsharded_flat, const at::Tensor& gathered,
                            const std::vector<ShardedParam>& params, int64_t s, at::ScalarType compute) const {
  at::NoGradGuard no_grad;
  const int64_t es = static_cast<int64_t>(c10::elementSize(compute));
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].geometry.shard_numel;
    if (weights[i]) {
      flat.narrow(0, s * at[i], s * n)
          .view({s, n})
          .copy_(gathered.narrow(1, compute_numel * es + at[i], n).view(at::kFloat8_e4m3fn));
    } else {
      unsharded_flat.narrow(0, s * at[i], s * n)
          .view({s, n})
          .copy_(gathered.narrow(1, at[i] * es, n * es).view(compute));
    }
  }
}

void set_float8_scales(const std::vector<ParamGroup*>& groups) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> amaxes;
  std::vector<Float8GatheredWeight*> weights;
  const EngineConfig* config = nullptr;
  for (ParamGroup* g : groups) {
    if (!g->float8_gather.on()) continue;
    config = g->config;
    for (size_t i = 0; i < g->params.size(); ++i) {
      if (!g->float8_gather.weights[i]) continue;
      // max |w| over this rank's rows (its padding is zeros), as torchao's inf-norm of the shard
      const auto [low, high] = at::aminmax(g->params[i].shard);
      amaxes.push_back(at::maximum(low.neg(), high));
      weights.push_back(g->float8_gather.weights[i].get());
    }
  }
  if (weights.empty()) return;
  at::Tensor all = at::stack(amaxes).to(config->device->device());
  {
    static const std::string kUnit = "float8 scales";
    CollectiveUnit scope(kUnit);
    config->comms.shard->all_reduce(all, ReduceOp::Max).wait();
  }
  const at::Tensor scales = float8_weight_scales(all);
  for (size_t i = 0; i < weights.size(); ++i) weights[i]->scale = scales[static_cast<int64_t>(i)];
  int64_t first = 0;
  for (ParamGroup* g : groups) {
    if (!g->float8_gather.on()) continue;
    int64_t n = 0;
    for (const auto& w : g->float8_gather.weights) n += w ? 1 : 0;
    g->float8_gather.cast_scales = scales.narrow(0, first, n).clone();
    first += n;
  }
}

}  // namespace fsdpx
