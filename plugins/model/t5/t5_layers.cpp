// T5's layers, numerically as transformers' T5ForConditionalGeneration computes them in eval mode
// (no dropout): same operations in the same order, so that fp32 logits agree to rounding.
#include <ATen/ops/abs.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/log.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fsdpx/float8.h>
#include <fsdpx/linear.h>
#include <fsdpx/model.h>

#include <cmath>
#include <limits>

#include "t5.h"

namespace t5 {
namespace {

at::Tensor deferred(at::IntArrayRef shape) { return fsdpx::deferred_tensor(shape); }

// The most negative finite value of `t`: what a blocked score becomes (transformers adds it).
double lowest(c10::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    case at::kHalf:
      return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    case at::kDouble:
      return std::numeric_limits<double>::lowest();
    default:
      return static_cast<double>(std::numeric_limits<float>::lowest());
  }
}

// In fp16, T5's activations can overflow; transformers clamps them after each sub-layer.
at::Tensor clamp_fp16(const at::Tensor& h) {
  if (h.scalar_type() != at::kHalf) return h;
  const double max = static_cast<double>(std::numeric_limits<c10::Half>::max());
  const double bound = at::isinf(h).any().item<bool>() ? max - 1000 : max;
  return at::clamp(h, -bound, bound);
}

}  // namespace

T5LayerNormImpl::T5LayerNormImpl(int64_t dim, double epsilon) : torch::nn::Module("T5LayerNorm"), eps(epsilon) {
  weight = register_parameter("weight", deferred({dim}));
}

at::Tensor T5LayerNormImpl::forward(const at::Tensor& x) {
  const at::Tensor xf = x.to(at::kFloat);
  return (xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type()) * weight;
}

T5AttentionImpl::T5AttentionImpl(const Config& c)
    : torch::nn::Module("T5Attention"), heads(c.heads), head_dim(c.head_dim) {
  q = register_parameter("q", deferred({c.inner(), c.dim}));
  k = register_parameter("k", deferred({c.inner(), c.dim}));
  v = register_parameter("v", deferred({c.inner(), c.dim}));
  o = register_parameter("o", deferred({c.dim, c.inner()}));
}

at::Tensor T5AttentionImpl::forward(const at::Tensor& x, const at::Tensor& kv, const at::Tensor& bias,
                                    const at::Tensor& blocked) {
  const at::Tensor& source = kv.defined() ? kv : x;
  const int64_t B = x.size(0), T = x.size(1), S = source.size(1);
  at::Tensor qh = fsdpx::linear(x, q).view({B, T, heads, head_dim}).transpose(1, 2);
  at::Tensor kh = fsdpx::linear(source, k).view({B, S, heads, head_dim}).transpose(1, 2);
  at::Tensor vh = fsdpx::linear(source, v).view({B, S, heads, head_dim}).transpose(1, 2);
  at::Tensor scores = at::matmul(qh, kh.transpose(2, 3));
  if (bias.defined()) scores = scores + bias;
  if (blocked.defined()) scores = scores.masked_fill(blocked, lowest(scores.scalar_type()));
  at::Tensor y = at::matmul(at::softmax(scores, -1), vh);
  return fsdpx::linear(y.transpose(1, 2).reshape({B, T, heads * head_dim}), o);
}

T5FeedForwardImpl::T5FeedForwardImpl(const Config& c) : torch::nn::Module("T5FeedForward"), gated(c.gated) {
  if (gated) {
    wi_0 = register_parameter("wi_0", deferred({c.ffn_hidden, c.dim}));
    wi_1 = register_parameter("wi_1", deferred({c.ffn_hidden, c.dim}));
  } else {
    wi = register_parameter("wi", deferred({c.ffn_hidden, c.dim}));
  }
  wo = register_parameter("wo", deferred({c.dim, c.ffn_hidden}));
}

at::Tensor T5FeedForwardImpl::forward(const at::Tensor& x) {
  // gelu_new, transformers' activation of gated-gelu, is GELU's tanh approximation.
  if (gated) return fsdpx::linear(at::gelu(fsdpx::linear(x, wi_0), "tanh") * fsdpx::linear(x, wi_1), wo);
  return fsdpx::linear(at::relu(fsdpx::linear(x, wi)), wo);
}

T5BlockImpl::T5BlockImpl(const Config& c, bool is_decoder) : torch::nn::Module("T5Block"), decoder(is_decoder) {
  self_attention_norm = register_module("self_attention_norm", T5LayerNorm(c.dim, c.norm_eps));
  self_attention = register_module("self_attention", T5Attention(c));
  if (decoder) {
    cross_attention_norm = register_module("cross_attention_norm", T5LayerNorm(c.dim, c.norm_eps));
    cross_attention = register_module("cross_attention", T5Attention(c));
  }
  ffn_norm = register_module("ffn_norm", T5LayerNorm(c.dim, c.norm_eps));
  feed_forward = register_module("feed_forward", T5FeedForward(c));
}

at::Tensor T5BlockImpl::forward(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& blocked,
                                const at::Tensor& encoder, const at::Tensor& encoder_blocked) {
  at::Tensor h = clamp_fp16(x + self_attention(self_attention_norm(x), at::Tensor(), bias, blocked));
  if (decoder) h = clamp_fp16(h + cross_attention(cross_attention_norm(h), encoder, at::Tensor(), encoder_blocked));
  return clamp_fp16(h + feed_forward(ffn_norm(h)));
}

// Half of the buckets (per direction when bidirectional) for exact distances, the rest for
// logarithmically wider ones up to max_distance; the scalars keep transformers' types (ints
// stay int64, its math.log a double), so that the buckets are the same integers.
at::Tensor relative_buckets(int64_t q, int64_t k, bool bidirectional, int64_t buckets, int64_t max_distance) {
  at::Tensor rel = at::arange(k, at::kLong).unsqueeze(0) - at::arange(q, at::kLong).unsqueeze(1);
  at::Tensor out = at::zeros_like(rel);
  int64_t n = buckets;
  if (bidirectional) {
    n /= 2;
    out = out + (rel > 0).to(at::kLong) * n;
    rel = rel.abs();
  } else {
    rel = -at::minimum(rel, at::zeros_like(rel));
  }
  const int64_t max_exact = n / 2;
  const at::Tensor small = rel < max_exact;
  at::Tensor large = (at::log(rel.to(at::kFloat) / max_exact) /
                      std::log(static_cast<double>(max_distance) / max_exact) * (n - max_exact))
                         .to(at::kLong) +
                     max_exact;
  large = at::minimum(large, at::full_like(large, n - 1));
  return out + at::where(small, rel, large);
}

T5StackImpl::T5StackImpl(const Config& c, bool is_decoder)
    : torch::nn::Module("T5Stack"), config(c), decoder(is_decoder) {
  relative_attention_bias = register_parameter("relative_attention_bias", deferred({c.buckets, c.heads}));
  block = register_module("block", torch::nn::ModuleList());
  for (int64_t i = 0; i < (decoder ? c.decoder_layers : c.layers); ++i) {
    blocks.push_back(T5Block(c, decoder));
    block->push_back(blocks.back());
  }
  final_layer_norm = register_module("final_layer_norm", T5LayerNorm(c.dim, c.norm_eps));
}

at::Tensor T5StackImpl::position_bias(int64_t q, int64_t k) {
  const at::Tensor b = relative_buckets(q, k, !decoder, config.buckets, config.max_distance);
  return at::embedding(relative_attention_bias, b).permute({2, 0, 1}).unsqueeze(0);
}

at::Tensor T5StackImpl::forward(const at::Tensor& h, const at::Tensor& blocked, const at::Tensor& encoder,
                                const at::Tensor& encoder_blocked) {
  const int64_t T = h.size(1);
  const at::Tensor bias = position_bias(T, T);
  at::Tensor self_blocked = blocked;
  if (decoder) self_blocked = at::ones({T, T}, h.options().dtype(at::kBool)).triu(1).view({1, 1, T, T});
  at::Tensor x = h;
  for (auto& b : blocks) x = b(x, bias, self_blocked, encoder, encoder_blocked);
  return final_layer_norm(x);
}

T5Impl::T5Impl(const Config& c) : torch::nn::Module("T5"), config(c) {
  shared = register_parameter("shared", deferred({c.vocab, c.dim}));
  encoder = register_module("encoder", T5Stack(c, false));
  decoder = register_module("decoder", T5Stack(c, true));
  if (!c.tie_embeddings) lm_head = register_parameter("lm_head", deferred({c.vocab, c.dim}));
}

at::Tensor T5Impl::forward(const at::Tensor& source, const at::Tensor& decoder_ids) {
  const at::Tensor blocked = (source == kPad).view({source.size(0), 1, 1, source.size(1)});
  const at::Tensor encoded = encoder(at::embedding(shared, source), blocked, at::Tensor(), at::Tensor());
  at::Tensor y = decoder(at::embedding(shared, decoder_ids), at::Tensor(), encoded, blocked);
  if (config.scale_logits) y = y * std::pow(static_cast<double>(config.dim), -0.5);
  return fsdpx::output_linear(y, config.tie_embeddings ? shared : lm_head);  // never float8
}

at::Tensor shift_right(const at::Tensor& labels) {
  at::Tensor d = at::zeros_like(labels);
  if (labels.size(1) > 1) d.narrow(1, 1, labels.size(1) - 1).copy_(labels.narrow(1, 0, labels.size(1) - 1));
  return d.masked_fill_(d == kIgnore, kPad);
}

}  // namespace t5
