// The work t5 states (fsdpx/layer_work.h): per layer of t5_layers.cpp's forward, its matmuls and
// the bytes and kernels of its other ops, forward and backward, at the paths of t5_memory.cpp's
// layers. The plan predicts a step's time from them (docs/planning.md).
#include "t5.h"

namespace t5 {
namespace {  // names apart from t5_memory.cpp's, which a unity build puts beside these

struct OpSizes {
  int64_t B, S, T, C, I, F, H, D, V, e;  // e: bytes per compute element; D: a head's width
  bool cast;                             // the compute dtype is below fp32: the norms and the loss cast
};

// T5's layer norm on N tokens: in fp32, the square, the mean, the reciprocal root, the scaling,
// the cast back and the weight's product (a cast in first below fp32). Backward: the products'
// gradients (the weight's summed over tokens), the mean's expansion, the square's gradient, the
// sum of the input's two gradients.
fsdpx::LayerOps norm_ops(const OpSizes& z, const std::string& path, int64_t N) {
  const int64_t f32 = 4 * N * z.C, x = N * z.C * z.e, casts = z.cast ? 2 * (x + f32) : 0;
  return {path, {}, {}, 7 * f32 + casts, 19 * f32 + casts, 6 + (z.cast ? 2 : 0), 14 + (z.cast ? 2 : 0)};
}

// Attention of B x Lq query tokens over B x Lk keys (not scaled_dot_product_attention: T5 adds
// its position bias to the scores): four projections, and the scores and the context as batched
// products over the B x H heads. Its other ops: the heads' copies for the batched products, the
// bias added (self-attention), the mask filled in, the softmax, the context's layout back to
// tokens, the residual's add. Backward: the softmax's and the fill's gradients, the bias's summed
// over the batch, the copies' and the layout's, the residual's.
fsdpx::LayerOps attention_ops(const OpSizes& z, const std::string& path, int64_t Lq, int64_t Lk, bool bias) {
  const int64_t Nq = z.B * Lq, Nk = z.B * Lk, BH = z.B * z.H;
  const int64_t A = BH * Lq * Lk * z.e, q = Nq * z.I * z.e, kv = Nk * z.I * z.e, x = Nq * z.C * z.e;
  const int64_t copies = 4 * q + 4 * kv;
  const int64_t scores = (bias ? 3 * A : 0) + 4 * A;
  return {path,
          {{Nq, z.C, z.I}, {Nk, z.C, z.I}, {Nk, z.C, z.I}, {Nq, z.I, z.C}, {Lq, z.D, Lk, BH}, {Lq, Lk, z.D, BH}},
          {},
          copies + scores + 3 * x,
          copies + 2 * scores + 2 * x,
          7 + (bias ? 1 : 0),
          9 + (bias ? 2 : 0)};
}

// ReLU, or gated GELU (the tanh GELU of one projection times the other), then the residual's add.
// Backward: the activation's gradient (and the product's two), the sum of the input's gradients
// from the two projections, the residual's.
fsdpx::LayerOps ffn_ops(const OpSizes& z, const std::string& path, int64_t N, bool gated) {
  const int64_t nf = N * z.F * z.e, x = N * z.C * z.e;
  if (gated) return {path, {{N, z.C, z.F}, {N, z.C, z.F}, {N, z.F, z.C}}, {}, 5 * nf + 3 * x, 9 * nf + 5 * x, 3, 6};
  return {path, {{N, z.C, z.F}, {N, z.F, z.C}}, {}, 2 * nf + 3 * x, 3 * nf + 2 * x, 2, 3};
}

// The lookup of N tokens' rows; its backward zeroes the table's gradient and adds the rows in.
fsdpx::LayerOps lookup_ops(const OpSizes& z, const std::string& path, int64_t N) {
  const int64_t x = N * z.C * z.e;
  return {path, {}, {}, 2 * x, z.V * z.C * z.e + 3 * x, 1, 2};
}

void add_stack_ops(std::vector<fsdpx::LayerOps>& out, const Config& c, const OpSizes& z, bool decoder) {
  const std::string s = decoder ? "decoder" : "encoder";
  const int64_t L = decoder ? z.T : z.S, N = z.B * L;
  // The buckets: about fifteen int64 ops over L x L (and the decoder's causal mask), then the
  // table's lookup into H x L x L; backward, its gradient added into the table's.
  const int64_t LL = L * L, bias = z.H * LL * z.e;
  out.push_back({s + ".relative_attention_bias", {}, {}, 15 * 16 * LL + 2 * bias, 3 * bias, 17, 2});
  for (int64_t i = 0; i < (decoder ? c.decoder_layers : c.layers); ++i) {
    const std::string p = s + ".block." + std::to_string(i) + ".";
    out.push_back(norm_ops(z, p + "self_attention_norm", N));
    out.push_back(attention_ops(z, p + "self_attention", L, L, true));
    if (decoder) {
      out.push_back(norm_ops(z, p + "cross_attention_norm", N));
      out.push_back(attention_ops(z, p + "cross_attention", z.T, z.S, false));
    }
    out.push_back(norm_ops(z, p + "ffn_norm", N));
    out.push_back(ffn_ops(z, p + "feed_forward", N, c.gated));
  }
  out.push_back(norm_ops(z, s + ".final_layer_norm", N));
}

}  // namespace

std::vector<fsdpx::LayerOps> layer_ops(const Config& c, int64_t batch, int64_t tokens, c10::ScalarType compute) {
  const int64_t S = std::max<int64_t>(1, tokens / 2), T = std::max<int64_t>(1, tokens - tokens / 2);
  const OpSizes z{batch,     S,         T, c.dim, c.inner(), c.ffn_hidden, c.heads, c.head_dim, c.vocab,
                static_cast<int64_t>(c10::elementSize(compute)), compute != at::kFloat};
  const int64_t Nd = z.B * z.T, nv = Nd * z.V, x = Nd * z.C * z.e;
  std::vector<fsdpx::LayerOps> out;
  out.push_back(lookup_ops(z, "encoder.embed_tokens", z.B * z.S));
  add_stack_ops(out, c, z, false);
  out.push_back(lookup_ops(z, c.tie_embeddings ? "decoder.embed_tokens" : "shared", Nd));
  add_stack_ops(out, c, z, true);
  // lm_head and the loss in one, as t5_memory.cpp states them: the logits' scaling (v1.0), the
  // projection, the cast to fp32, log-softmax and the targets' picks; backward: the picks'
  // gradient into zeros, log-softmax's gradient, the cast back, the scaling's.
  const int64_t casts = z.cast ? nv * (z.e + 4) : 0, scale = c.scale_logits ? 2 * x : 0;
  out.push_back({c.tie_embeddings ? "shared" : "lm_head",
                 {{Nd, z.C, z.V}},
                 {},
                 scale + casts + 8 * nv,
                 scale + casts + 16 * nv,
                 3 + (c.scale_logits ? 1 : 0),
                 4 + (c.scale_logits ? 1 : 0)});
  return out;
}

}  // namespace t5
