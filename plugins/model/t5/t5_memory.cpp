// The activation memory t5 states (fsdpx/activation_memory.h): per layer, the bytes LibTorch's
// autograd keeps for backward from the ops of t5_layers.cpp, and the temporaries at the worst
// moments. The plan replays them with the engine's own buffers to predict a step's peak.
#include "t5.h"

namespace t5 {
namespace {

struct Sizes {
  int64_t B, S, T, C, I, F, H, V, e;  // e: bytes per compute element
  bool fp32;
};

// T5's layer norm on N tokens (gpt's RMSNorm, the same ops): its fp32 input (the input itself in
// fp32, a copy otherwise), the reciprocal norms, the normalised values and its output in the
// compute dtype; x.pow(2) is a temporary of 4NC, and so (below fp32) is the fp32 normalised input.
fsdpx::LayerActivations norm(const Sizes& z, const std::string& path, int64_t N) {
  const int64_t NC = N * z.C, x = NC * z.e;
  return {path, 4 * NC + 2 * x + 4 * N, x, z.fp32 ? 4 * NC : 8 * NC, 4 * NC + 2 * x + 4 * N + 12 * NC + 2 * x};
}

// Attention of Nq query tokens over Nk key tokens (A scores): matmul keeps contiguous copies of
// the heads of q, k and v, the softmax its output, the output projection its input; the scores
// plus bias and the masked scores are temporaries (two A at once), as are the projections. Its
// backward adds gradients of the probabilities and the scores, and of q, k, v and their copies.
fsdpx::LayerActivations attention(const Sizes& z, const std::string& path, int64_t Nq, int64_t Nk, int64_t Lq,
                                  int64_t Lk) {
  const int64_t A = z.B * z.H * Lq * Lk * z.e, q = Nq * z.I * z.e, kv = Nk * z.I * z.e;
  const int64_t saved = 2 * q + 2 * kv + A;
  return {path, saved, Nq * z.C * z.e, 2 * A + q + 2 * kv, saved + 2 * A + 2 * q + 4 * kv + Nq * z.C * z.e};
}

// ReLU: its output (N x F); gated GELU: wi_0's output, the GELU, wi_1's output, the product.
fsdpx::LayerActivations feed_forward(const Sizes& z, const std::string& path, int64_t N, bool gated) {
  const int64_t nf = N * z.F * z.e, x = N * z.C * z.e;
  if (gated) return {path, 4 * nf, x, nf, 6 * nf + x};
  return {path, nf, x, nf, 3 * nf + x};
}

void add_stack(std::vector<fsdpx::LayerActivations>& out, const Config& c, const Sizes& z, bool decoder) {
  const std::string s = decoder ? "decoder" : "encoder";
  const int64_t L = decoder ? z.T : z.S, N = z.B * L, Ne = z.B * z.S;
  // The bias table's lookup keeps the buckets (int64); the bias itself is a temporary of each block.
  out.push_back({s + ".relative_attention_bias", 8 * L * L + (decoder ? L * L : z.B * z.S), 0, 4 * z.H * L * L, 0});
  for (int64_t i = 0; i < (decoder ? c.decoder_layers : c.layers); ++i) {
    const std::string p = s + ".block." + std::to_string(i) + ".";
    out.push_back(norm(z, p + "self_attention_norm", N));
    out.push_back(attention(z, p + "self_attention", N, N, L, L));
    if (decoder) {
      out.push_back(norm(z, p + "cross_attention_norm", N));
      out.push_back(attention(z, p + "cross_attention", N, Ne, z.T, z.S));
    }
    out.push_back(norm(z, p + "ffn_norm", N));
    out.push_back(feed_forward(z, p + "feed_forward", N, c.gated));
  }
  out.push_back(norm(z, s + ".final_layer_norm", N));
}

}  // namespace

std::vector<fsdpx::LayerActivations> activations(const Config& c, int64_t batch, int64_t tokens,
                                                 c10::ScalarType compute) {
  Sizes z{batch,
          std::max<int64_t>(1, tokens / 2),
          std::max<int64_t>(1, tokens - tokens / 2),
          c.dim,
          c.inner(),
          c.ffn_hidden,
          c.heads,
          c.vocab,
          static_cast<int64_t>(c10::elementSize(compute)),
          compute == at::kFloat};
  const int64_t Ne = z.B * z.S, Nd = z.B * z.T, NV = Nd * z.V;
  std::vector<fsdpx::LayerActivations> out;
  // The embeddings keep their token ids (int64); their gradient's backward is a scatter.
  out.push_back({"encoder.embed_tokens", 8 * Ne, 0, 0, Ne * z.C * z.e + 16 * Ne});
  add_stack(out, c, z, false);
  // An untied shared embedding gets its gradient here first (its path names the parameter).
  out.push_back({c.tie_embeddings ? "decoder.embed_tokens" : "shared", 8 * Nd, 0, 0, Nd * z.C * z.e + 16 * Nd});
  add_stack(out, c, z, true);
  // lm_head and the loss in one (gpt states them apart): log_softmax keeps its fp32 output; the logits are a
  // temporary; its backward holds three N x V fp32 tensors at once. Tied: the shared embedding's
  // gradient starts here.
  out.push_back({c.tie_embeddings ? "shared" : "lm_head", 4 * NV, Nd * z.C * z.e, 4 * NV, 12 * NV + Nd * z.C * z.e});
  return out;
}

}  // namespace t5
