// ShardingEngine::clip_grad_norm: the gradient shards' global norm, and its deterministic form
// whose bits do not depend on how the sum is split.
#include "fsdpx/framework/engine/sharding_engine.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "engine_state.h"
#include "fsdpx/framework/engine/unit_buffers.h"

namespace fsdpx {

namespace {

// Calls f(chunk) for consecutive pieces of at most kGradNormChunk elements of every gradient, in
// double.
template <class F>
void for_each_chunk_in_double(const std::vector<at::Tensor>& grads, F f) {
  for (const auto& g : grads)
    for (int64_t at = 0; at < g.numel(); at += kGradNormChunk)
      f(g.narrow(0, at, std::min(kGradNormChunk, g.numel() - at))
            .to(at::kDouble, /*non_blocking=*/false, /*copy=*/true));
}

// The squared norm of the gradient shards summed over the shard group in any order and split,
// with the same bits: each element's square (exact in double) is truncated to a multiple of
// 2^(e - 30), where 2^e bounds the largest square over the group, and the multiples are summed
// as integers, which is associative: the same bits in any order, within elements x 2^-30 of the
// largest square of the exact sum.
// `t` := op over the shard group (which carries device tensors), or itself without one.
using GroupReduce = std::function<void(at::Tensor&, ReduceOp)>;

double fixed_point_squared_norm(const std::vector<at::Tensor>& grads, const GroupReduce& reduce,
                                const at::TensorOptions& on) {
  at::Tensor peak = at::zeros({1}, on.dtype(at::kDouble));
  for_each_chunk_in_double(grads, [&](const at::Tensor& c) { peak = peak.maximum(c.pow(2).max().reshape({1})); });
  reduce(peak, ReduceOp::Max);
  const double top = peak.item<double>();
  if (!(top > 0) || !std::isfinite(top)) return top;  // all zero, or inf/NaN: nothing to sum exactly
  int e = 0;
  std::frexp(top, &e);  // top < 2^e
  // 2^(30 - e) in two factors: one would overflow a double for squares below 2^-993.
  const double half = std::ldexp(1.0, (30 - e) / 2), rest = std::ldexp(1.0, 30 - e - (30 - e) / 2);
  at::Tensor sum = at::zeros({1}, on.dtype(at::kLong));
  for_each_chunk_in_double(
      grads, [&](const at::Tensor& c) { sum += c.pow_(2).mul_(half).mul_(rest).floor_().to(at::kLong).sum(); });
  reduce(sum, ReduceOp::Sum);
  return std::ldexp(static_cast<double>(sum.item<int64_t>()), e - 30);
}
}  // namespace

double ShardingEngine::clip_grad_norm(double max_norm) {
  Impl& e = *impl_;
  std::vector<at::Tensor> grads;
  for (auto& u : e.units) grads.push_back(u->group.flat_grad);
  // Where the gradient shards are (the device, or host memory when offloading).
  const at::TensorOptions on = grads.empty() ? at::TensorOptions() : grads.front().options();
  const GroupReduce reduce = [&](at::Tensor& t, ReduceOp op) {
    if (!e.config.comms.shard) return;
    t = t.to(e.config.device->device());
    e.config.comms.shard->all_reduce(t, op).wait();
  };
  at::Tensor sq = at::zeros({1}, on.dtype(at::kDouble));
  if (e.config.options.deterministic) {
    sq.fill_(fixed_point_squared_norm(grads, reduce, on));
  } else {
    for_each_chunk_in_double(grads, [&](const at::Tensor& c) { sq += c.pow_(2).sum(); });
    reduce(sq, ReduceOp::Sum);
  }
  const double norm = std::sqrt(sq.item<double>());
  const double scale = max_norm / (norm + 1e-6);
  if (scale < 1.0) {
    at::NoGradGuard no_grad;
    for (auto& g : grads) g.mul_(scale);
  }
  return norm;
}

}  // namespace fsdpx
