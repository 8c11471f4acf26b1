// gpt: a Llama-style decoder. RMSNorm, rotary position embeddings, SwiGLU MLP, causal attention
// through at::scaled_dot_product_attention, grouped-query attention (kv_heads), optionally tied
// input/output embeddings. It is Hugging Face's LlamaForCausalLM: --model.from_hf DIR takes the
// configuration from DIR/config.json and the initial weights from DIR's safetensors files
// (fsdpx/hf_interop.h), and fsdpx-ckpt export-hf writes a checkpoint back in those names.
//
// Parameters are created deferred (fsdpx::deferred_tensor): nothing is allocated until the
// sharding engine materialises them one at a time (init_parameter), so even the 7b size plans
// in an instant.
// Block, Attention, FeedForward, Embedding and Output are declared with FSDPX_MODULE: any of them
// can be a unit (torchtitan shards tok_embeddings and output as units of their own).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <nlohmann/json.hpp>
#include <torch/nn/modules/container/modulelist.h>

#include <fsdpx/activation_memory.h>
#include <fsdpx/capabilities.h>
#include <fsdpx/checkpoint_names.h>
#include <fsdpx/error.h>
#include <fsdpx/evaluation.h>
#include <fsdpx/files.h>
#include <fsdpx/float8.h>
#include <fsdpx/hf_config.h>
#include <fsdpx/hf_interop.h>
#include <fsdpx/layer_work.h>
#include <fsdpx/linear.h>
#include <fsdpx/model.h>
#include <fsdpx/plugin.h>
#include <fsdpx/unit.h>

namespace {

using json = nlohmann::json;

struct Config {
  int64_t dim = 64, layers = 2, heads = 4, vocab = 256, seq = 64, ffn_hidden = 0;
  bool tie_embeddings = false;
  double rope_theta = 10000.0, norm_eps = 1e-5;
  int64_t kv_heads = 0;  // 0: heads (multi-head attention); fewer: grouped-query attention
  int64_t head_dim() const { return dim / heads; }
};

at::Tensor deferred(at::IntArrayRef shape) { return fsdpx::deferred_tensor(shape); }

struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double epsilon) : torch::nn::Module("RMSNorm"), eps(epsilon) {
    weight = register_parameter("weight", deferred({dim}));
  }
  // Normalised in fp32 whatever the compute dtype, as transformers' Llama does: in fp16 the
  // backward of rsqrt (r^3, 1.25e5 for activations of 0.02) would overflow.
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor xf = x.to(at::kFloat);
    return (xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type()) * weight;
  }
  double eps;
  at::Tensor weight;
};
TORCH_MODULE(RMSNorm);

// Rotary embedding of x [B, H, T, D] with cos/sin [T, D/2].
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return at::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
}

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const Config& c)
      : torch::nn::Module("Attention"), heads(c.heads), kv_heads(c.kv_heads), theta(c.rope_theta) {
    const int64_t kv_dim = c.kv_heads * c.head_dim();
    wq = register_parameter("wq", deferred({c.dim, c.dim}));
    wk = register_parameter("wk", deferred({kv_dim, c.dim}));
    wv = register_parameter("wv", deferred({kv_dim, c.dim}));
    wo = register_parameter("wo", deferred({c.dim, c.dim}));
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / heads;
    auto split = [&](const at::Tensor& t, int64_t h) { return t.view({B, T, h, D}).transpose(1, 2); };
    at::Tensor q = split(fsdpx::linear(x, wq), heads), k = split(fsdpx::linear(x, wk), kv_heads),
               v = split(fsdpx::linear(x, wv), kv_heads);
    if (kv_heads != heads) {  // each key/value head serves heads / kv_heads consecutive query heads
      k = k.repeat_interleave(heads / kv_heads, 1);
      v = v.repeat_interleave(heads / kv_heads, 1);
    }
    // Frequencies as transformers computes them (1 / theta^(2i/D)), so that logits agree closely.
    at::Tensor inv = at::reciprocal(at::pow(theta, at::arange(0, D, 2, x.options()) / static_cast<double>(D)));
    at::Tensor angles = at::outer(at::arange(T, x.options()), inv);
    at::Tensor cos = angles.cos(), sin = angles.sin();
    q = rotate(q, cos, sin);
    k = rotate(k, cos, sin);
    at::Tensor y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
    return fsdpx::linear(y.transpose(1, 2).reshape({B, T, C}), wo);
  }
  int64_t heads, kv_heads;
  double theta;
  at::Tensor wq, wk, wv, wo;
};
FSDPX_MODULE(Attention);

struct FeedForwardImpl : torch::nn::Module {
  FeedForwardImpl(int64_t dim, int64_t hidden) : torch::nn::Module("FeedForward") {
    w1 = register_parameter("w1", deferred({hidden, dim}));
    w2 = register_parameter("w2", deferred({dim, hidden}));
    w3 = register_parameter("w3", deferred({hidden, dim}));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fsdpx::linear(at::silu(fsdpx::linear(x, w1)) * fsdpx::linear(x, w3), w2);
  }
  at::Tensor w1, w2, w3;
};
FSDPX_MODULE(FeedForward);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const Config& c) : torch::nn::Module("Block") {
    attention_norm = register_module("attention_norm", RMSNorm(c.dim, c.norm_eps));
    attention = register_module("attention", Attention(c));
    ffn_norm = register_module("ffn_norm", RMSNorm(c.dim, c.norm_eps));
    feed_forward = register_module("feed_forward", FeedForward(c.dim, c.ffn_hidden));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x + attention(attention_norm(x));
    return h + feed_forward(ffn_norm(h));
  }
  RMSNorm attention_norm{nullptr}, ffn_norm{nullptr};
  Attention attention{nullptr};
  FeedForward feed_forward{nullptr};
};
FSDPX_MODULE(Block);

// A [vocab, dim] table, the weight of the token embedding and of the output projection.
struct VocabTable : torch::nn::Module {
  VocabTable(const std::string& type, int64_t vocab, int64_t dim) : torch::nn::Module(type) {
    weight = register_parameter("weight", deferred({vocab, dim}));
  }
  at::Tensor weight;
};

// The token embedding (torchtitan's tok_embeddings).
struct EmbeddingImpl : VocabTable {
  EmbeddingImpl(int64_t vocab, int64_t dim) : VocabTable("Embedding", vocab, dim) {}
  at::Tensor forward(const at::Tensor& tokens) { return at::embedding(weight, tokens); }
};
FSDPX_MODULE(Embedding);
// Tied to the output projection, the table is used again after the last layer, outside the
// embedding's forward: such an embedding cannot be a unit, so its holder is not wrappable and
// the engine refuses it by name.
struct TiedEmbeddingImpl : EmbeddingImpl {
  using EmbeddingImpl::EmbeddingImpl;
};
TORCH_MODULE(TiedEmbedding);

// The output projection to the vocabulary, without bias (torchtitan's output).
struct OutputImpl : VocabTable {
  OutputImpl(int64_t vocab, int64_t dim) : VocabTable("Output", vocab, dim) {}
  at::Tensor forward(const at::Tensor& h) { return fsdpx::output_linear(h, weight); }  // never float8
};
FSDPX_MODULE(Output);

struct TransformerImpl : torch::nn::Module {
  TransformerImpl(const Config& c) : torch::nn::Module("Transformer"), config(c) {
    if (c.tie_embeddings)
      tied_embeddings = register_module("tok_embeddings", TiedEmbedding(c.vocab, c.dim));
    else
      tok_embeddings = register_module("tok_embeddings", Embedding(c.vocab, c.dim));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks.push_back(Block(c));
      layers->push_back(blocks.back());
    }
    norm = register_module("norm", RMSNorm(c.dim, c.norm_eps));
    if (!c.tie_embeddings) output = register_module("output", Output(c.vocab, c.dim));
  }
  at::Tensor forward(const at::Tensor& tokens) {
    if (config.tie_embeddings) {
      at::Tensor h = tied_embeddings->forward(tokens);
      for (auto& block : blocks) h = block(h);
      return fsdpx::output_linear(norm(h), tied_embeddings->weight);
    }
    at::Tensor h = tok_embeddings(tokens);
    for (auto& block : blocks) h = block(h);
    return output(norm(h));
  }
  Config config;
  Embedding tok_embeddings{nullptr};
  TiedEmbedding tied_embeddings{nullptr};
  Output output{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<Block> blocks;
  RMSNorm norm{nullptr};
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// fsdpx's parameter names and LlamaForCausalLM's, one to one (the same layouts: both rotate
// halves of a head, so q and k need no permutation).
const std::vector<std::pair<std::string, std::string>>& layer_names() {
  static const std::vector<std::pair<std::string, std::string>> names{
      {"attention_norm.weight", "input_layernorm.weight"},  {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attention.wq", "self_attn.q_proj.weight"},          {"attention.wk", "self_attn.k_proj.weight"},
      {"attention.wv", "self_attn.v_proj.weight"},          {"attention.wo", "self_attn.o_proj.weight"},
      {"feed_forward.w1", "mlp.gate_proj.weight"},          {"feed_forward.w3", "mlp.up_proj.weight"},
      {"feed_forward.w2", "mlp.down_proj.weight"}};
  return names;
}

std::string hf_name_of(const std::string& name) {
  if (name == "tok_embeddings.weight") return "model.embed_tokens.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (name == "norm.weight") return "model.norm.weight";
  static const std::regex layer(R"(layers\.([0-9]+)\.(.+))");
  std::smatch m;
  if (std::regex_match(name, m, layer))
    for (const auto& [mine, theirs] : layer_names())
      if (m[2] == mine) return "model.layers." + m[1].str() + "." + theirs;
  throw fsdpx::Error("gpt has no Hugging Face name for parameter '" + name + "'");
}

// torchtitan's Llama names for a gpt parameter: its projections are nn.Linear modules (a ".weight"
// more), grouped under attention.qkv_linear and with the output projection named lm_head from
// torchtitan 0.3; the norms and the embedding are named alike.
std::vector<std::string> torchtitan_names_of(const std::string& name) {
  if (name == "output.weight") return {"lm_head.weight"};
  static const std::regex layer(R"(layers\.([0-9]+)\.(attention\.w[qkvo]|feed_forward\.w[123]))");
  std::smatch m;
  if (!std::regex_match(name, m, layer)) return {};
  std::vector<std::string> out{name + ".weight"};
  const std::string proj = m[2].str();
  if (proj != "attention.wo" && proj.rfind("attention.", 0) == 0)
    out.push_back("layers." + m[1].str() + ".attention.qkv_linear." + proj.substr(10) + ".weight");
  return out;
}

// The bytes each layer of gpt keeps for its backward and holds at its worst moments, from the
// tensors LibTorch's autograd saves for the ops below (N tokens per rank, width C, hidden F,
// vocabulary V, heads H, e bytes per compute element; RMSNorm computes in fp32 whatever e is).
std::vector<fsdpx::LayerActivations> gpt_activations(const Config& c, int64_t batch, int64_t seq,
                                                     c10::ScalarType compute) {
  const int64_t N = batch * seq, C = c.dim, F = c.ffn_hidden, V = c.vocab, H = c.heads;
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute)), NC = N * C, x = NC * e;
  const bool fp32 = compute == at::kFloat;
  // RMSNorm: its fp32 input (the input itself in fp32, a copy otherwise), the normalised values
  // before the weight, its output, the reciprocal norms; x.pow(2) is a temporary of 4NC, and
  // so (below fp32) is the fp32 normalised input before its cast.
  auto norm = [&](const std::string& path) {
    return fsdpx::LayerActivations{path, 4 * NC + 2 * x + 4 * N, x, fp32 ? 4 * NC : 8 * NC,
                                   4 * NC + 2 * x + 4 * N + 12 * NC + 2 * x};
  };
  // Attention: the rotated queries and keys, the values, the output and its transposed copy
  // (scaled_dot_product_attention's flash kernel keeps q, k, v, out and the fp32 log-sum-exp),
  // the rotary tables; the projections before rotation are temporaries. Its backward adds the
  // gradients of q, k, v and their projections.
  const int64_t rope = 2 * seq * (C / H / 2) * e * 2;
  const fsdpx::LayerActivations attention{"", 5 * x + 4 * N * H + rope, x, 3 * x,
                                          5 * x + 4 * N * H + rope + 5 * x + 4 * NC};
  // SwiGLU: w1's and w3's outputs, the SiLU and the product (each N x F); its backward holds
  // up to two more N x F gradients besides them.
  const fsdpx::LayerActivations ffn{"", 4 * N * F * e, x, 0, 6 * N * F * e + x};
  std::vector<fsdpx::LayerActivations> out;
  out.push_back({"tok_embeddings", 0, 0, 0, x + 16 * N});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    out.push_back(norm(p + "attention_norm"));
    out.push_back(attention);
    out.back().path = p + "attention";
    out.push_back(norm(p + "ffn_norm"));
    out.push_back(ffn);
    out.back().path = p + "feed_forward";
  }
  out.push_back(norm("norm"));
  // The output projection (its input is the final norm's output, counted there); its backward
  // holds the logits' fp32 gradient (and below fp32 its cast) with the input's gradient.
  const int64_t NV = N * V;
  out.push_back({"output", 0, x, 0, 4 * NV + (fp32 ? 0 : NV * e) + x});
  // The loss, the root's own code after the model's output: log_softmax keeps its fp32 output;
  // the fp32 logits are a temporary (below fp32, the logits in the compute dtype go once cast);
  // its backward holds three N x V fp32 tensors at once.
  out.push_back({"loss", 4 * NV, NV * e, 4 * NV, 12 * NV + x});
  return out;
}

// The work of each layer of gpt on one rank, in gpt_activations' layers: its matmuls, its
// attention, and the bytes and kernels of its other ops as LibTorch runs them, forward and
// backward (N tokens, x bytes of one hidden state in the compute dtype, e bytes per element).
std::vector<fsdpx::LayerOps> gpt_layer_ops(const Config& c, int64_t batch, int64_t seq, c10::ScalarType compute) {
  const int64_t N = batch * seq, C = c.dim, F = c.ffn_hidden, V = c.vocab, H = c.heads;
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute)), x = N * C * e, f32 = 4 * N * C;
  const int64_t kv = c.kv_heads * c.head_dim(), xkv = N * kv * e;
  const bool cast = compute != at::kFloat;
  // RMSNorm in fp32: the square, the mean, the scaling and the weight's product; below fp32 a cast
  // each way. Its backward: the two products' gradients (and the weight's, summed over tokens),
  // the mean's expansion, the square's gradient and the sum of the input's two gradients.
  fsdpx::LayerOps norm{"",
                       {},
                       {},
                       7 * f32 + (cast ? 2 * (x + f32) : 0),
                       19 * f32 + (cast ? 2 * (x + f32) : 0),
                       6 + (cast ? 2 : 0),
                       14 + (cast ? 2 : 0)};
  // Attention: q and k rotated (four products, a sum and a difference, the halves joined), keys
  // and values repeated for grouped-query heads, the output re-laid out, the residual add; the
  // rotary tables (six small kernels). Backward: the rotations' gradients (products, the halves
  // scattered back into zeros and added), the layout's, the residual's sum.
  const bool gqa = c.kv_heads != c.heads;
  fsdpx::LayerOps attention{"",
                            {{N, C, C}, {N, C, kv}, {N, C, kv}, {N, C, C}},
                            {{batch, H, seq, c.head_dim(), true}},
                            9 * (x + xkv) + (gqa ? 4 * xkv : 0) + 2 * x + 3 * x,
                            15 * (x + xkv) + (gqa ? 4 * xkv : 0) + 2 * x + 3 * x,
                            14 + 6 + (gqa ? 2 : 0) + 2,
                            24 + (gqa ? 2 : 0) + 3};
  // SwiGLU: SiLU and the product, the residual add. Backward: the product's two gradients,
  // SiLU's, the sum of the input's gradients from w1 and w3, the residual's sum.
  const int64_t nf = N * F * e;
  fsdpx::LayerOps ffn{"", {{N, C, F}, {N, C, F}, {N, F, C}}, {}, 5 * nf + 3 * x, 9 * nf + 6 * x, 3, 6};
  std::vector<fsdpx::LayerOps> out;
  // The lookup; its backward zeroes the table's gradient and adds the rows in.
  out.push_back({"tok_embeddings", {}, {}, 2 * x, V * C * e + 3 * x, 1, 2});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    for (auto [path, ops] : {std::pair{p + "attention_norm", norm}, std::pair{p + "attention", attention},
                             std::pair{p + "ffn_norm", norm}, std::pair{p + "feed_forward", ffn}}) {
      ops.path = path;
      out.push_back(ops);
    }
  }
  norm.path = "norm";
  out.push_back(norm);
  out.push_back({"output", {{N, C, V}}, {}, 0, 0, 0, 0});
  // The loss: the logits cast to fp32, log-softmax, the targets' picks; backward: the picks'
  // gradient into zeros, log-softmax's gradient, the cast back.
  const int64_t nv = N * V;
  out.push_back(
      {"loss", {}, {}, (cast ? nv * (e + 4) : 0) + 8 * nv, 4 * nv + 12 * nv + (cast ? nv * (e + 4) : 0), 3, 4});
  return out;
}

class Gpt final : public fsdpx::Model,
                  public fsdpx::Evaluable,
                  public fsdpx::HuggingFaceModel,
                  public fsdpx::CheckpointNames,
                  public fsdpx::ActivationMemory,
                  public fsdpx::LayerWork,
                  public fsdpx::LinearWeights {
 public:
  Gpt(const Config& c, std::string hf_dir, std::string hf_config)
      : config_(c),
        root_(std::make_shared<TransformerImpl>(c)),
        hf_dir_(std::move(hf_dir)),
        hf_config_(std::move(hf_config)) {
    for (const auto& p : root_->parameters()) params_ += p.numel();
  }
  std::shared_ptr<torch::nn::Module> module() override { return root_; }

  std::string hf_weights_dir() const override { return hf_dir_; }
  std::string hf_name(const std::string& name) const override { return hf_name_of(name); }
  std::vector<std::string> other_checkpoint_names(const std::string& name) const override {
    return torchtitan_names_of(name);
  }
  bool hf_ignorable(const std::string& name) const override {
    // Rotary caches of older checkpoints; the output projection a tied checkpoint may still hold.
    return name.find("rotary_emb.inv_freq") != std::string::npos ||
           (config_.tie_embeddings && name == "lm_head.weight");
  }
  std::string hf_config_json() const override;
  // The Blocks' projections, read by fsdpx::linear alone (float8 all-gather may hold them in
  // float8 only); the embedding and output tables are read otherwise.
  bool linear_weight(const std::string& name) const override {
    for (const char* w : {".attention.wq", ".attention.wk", ".attention.wv", ".attention.wo", ".feed_forward.w1",
                          ".feed_forward.w2", ".feed_forward.w3"})
      if (ends_with(name, w)) return true;
    return false;
  }
  at::Tensor hf_logits(const at::Tensor& token_ids) override { return logits_of(token_ids); }

  void init_parameter(const std::string& name, at::Tensor& param, at::Generator& gen) const override {
    at::NoGradGuard no_grad;
    if (ends_with(name, "norm.weight")) {
      param.fill_(1.0);
    } else if (ends_with(name, ".wo") || ends_with(name, ".w2")) {
      // Residual projections scaled down with depth (GPT-2's rule).
      param.normal_(0.0, 0.02 / std::sqrt(2.0 * config_.layers), gen);
    } else {
      param.normal_(0.0, 0.02, gen);
    }
  }

  at::Tensor loss(const fsdpx::Batch& batch) override {
    // The loss in fp32 whatever the compute dtype (as autocast does): a bf16 loss is rounded
    // to 1/32 near 5.5.
    at::Tensor logits = logits_of(batch.inputs);
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape({-1}));
  }

  // The loss summed over samples (each sample's mean over its tokens), for held-out evaluation.
  fsdpx::EvalSums evaluate(const fsdpx::Batch& batch) override {
    fsdpx::EvalSums s;
    s.samples = batch.inputs.size(0);
    if (s.samples == 0) return s;
    at::Tensor logits = logits_of(batch.inputs);
    s.loss_sum =
        at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape({-1})).item<double>() *
        static_cast<double>(s.samples);
    return s;
  }

  // Tied, the embedding's table is used after the last layer too: it cannot be a unit.
  std::vector<std::string> layer_types() const override {
    if (config_.tie_embeddings) return {"Block", "Attention", "FeedForward"};
    return {"Block", "Attention", "FeedForward", "Embedding", "Output"};
  }
  std::vector<fsdpx::LayerActivations> activations(int64_t batch, int64_t seq, c10::ScalarType compute) const override {
    return gpt_activations(config_, batch, seq, compute);
  }
  std::vector<fsdpx::LayerOps> layer_ops(int64_t batch, int64_t seq, c10::ScalarType compute) const override {
    return gpt_layer_ops(config_, batch, seq, compute);
  }
  // Training FLOPs per token as torchtitan counts them (get_num_flop_per_token), so that MFU compares:
  // 6 per parameter outside the token embedding (a lookup, no matmul; a tied output projection goes
  // uncounted with it, as there), plus 12*L*H*Q*T for attention's two matmuls per head, forward and
  // backward, causal masking not discounted. T is the model's context (--model.seq): torchtitan's is
  // the training sequence length, the same when the data's sequences fill the context.
  double flops_per_token() const override {
    const Config& c = config_;
    const auto non_embedding = static_cast<double>(params_ - c.vocab * c.dim);
    return 6.0 * non_embedding + 12.0 * static_cast<double>(c.layers * c.heads * c.head_dim() * c.seq);
  }

 private:
  at::Tensor logits_of(const at::Tensor& t) {
    if (t.dim() != 2)
      throw fsdpx::Error("gpt expects token ids of shape [batch, seq], the data gives " + c10::str(t.sizes()) +
                         "; choose a token data source (text, tokens, synthetic)");
    if (t.size(1) > config_.seq)
      throw fsdpx::Error("the data's sequences have " + std::to_string(t.size(1)) +
                         " tokens, more than the model's context of " + std::to_string(config_.seq) +
                         "; set --data.seq " + std::to_string(config_.seq) + " or less, or --model.seq " +
                         std::to_string(t.size(1)) + " or more");
    if (t.numel() > 0) {
      const int64_t hi = t.max().item<int64_t>();
      if (hi >= config_.vocab)
        throw fsdpx::Error("the data holds token id " + std::to_string(hi) + ", outside the model's vocabulary of " +
                           std::to_string(config_.vocab) + "; set --model.vocab " + std::to_string(hi + 1) +
                           " or more");
    }
    return root_->forward(t).to(at::kFloat);
  }

  Config config_;
  std::shared_ptr<TransformerImpl> root_;
  std::string hf_dir_, hf_config_;  // --model.from_hf and its config.json as read
  int64_t params_ = 0;
};

// The source's config.json with what training may not change checked, or one made from the
// configuration.
std::string Gpt::hf_config_json() const {
  json j = hf_config_.empty() ? json::object() : json::parse(hf_config_);
  if (hf_config_.empty()) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["hidden_act"] = "silu";
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["max_position_embeddings"] = config_.seq;
  }
  j["hidden_size"] = config_.dim;
  j["intermediate_size"] = config_.ffn_hidden;
  j["num_hidden_layers"] = config_.layers;
  j["num_attention_heads"] = config_.heads;
  j["num_key_value_heads"] = config_.kv_heads;
  j["head_dim"] = config_.head_dim();
  j["vocab_size"] = config_.vocab;
  j["rms_norm_eps"] = config_.norm_eps;
  j["tie_word_embeddings"] = config_.tie_embeddings;
  // Both spellings: rope_parameters (transformers 5) and rope_theta (earlier versions).
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", config_.rope_theta}};
  j["rope_theta"] = config_.rope_theta;
  return j.dump(2);
}

// --- --model.from_hf: a Hugging Face Llama directory's config.json --------------------------------

// A key of config.json of the JSON type `T`; `fallback` when absent (nullopt: required).
template <class T>
T hf_value(const json& j, const std::string& file, const char* key, std::optional<T> fallback = std::nullopt) {
  return fsdpx::hf::config_value<T>(j, file, key, "Llama", fallback);
}

// The rope settings: transformers 5's rope_parameters, or rope_theta and rope_scaling before it.
void read_rope(const json& j, const std::string& file, Config& c) {
  c.rope_theta = hf_value<double>(j, file, "rope_theta", 10000.0);
  std::string type = "default";
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const json& r = j[key];
    if (!r.is_object()) throw fsdpx::Error(file + ": '" + key + "' is " + r.dump() + ", not an object");
    if (r.contains("rope_theta")) c.rope_theta = hf_value<double>(r, file, "rope_theta");
    if (r.contains("rope_type")) type = hf_value<std::string>(r, file, "rope_type");
    else if (r.contains("type")) type = hf_value<std::string>(r, file, "type");
    if (type != "default")
      throw fsdpx::Error(file + ": " + key + " of type '" + type +
                         "' is not implemented: gpt computes rotary embeddings "
                         "without scaling (rope type 'default')");
  }
}

Config config_from_hf(const json& j, const std::string& file) {
  const std::string type = hf_value<std::string>(j, file, "model_type", std::string());
  if (type != "llama")
    throw fsdpx::Error(file + ": model_type '" + type + "' is not a Llama; --model.from_hf reads LlamaForCausalLM "
                       "directories (model_type 'llama')");
  if (const std::string act = hf_value<std::string>(j, file, "hidden_act", std::string("silu")); act != "silu")
    throw fsdpx::Error(file + ": hidden_act '" + act + "' is not implemented (gpt's MLP is SwiGLU: 'silu')");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (hf_value<bool>(j, file, bias, false))
      throw fsdpx::Error(file + ": " + bias + " is true; gpt's projections have no biases");
  Config c;
  c.dim = hf_value<int64_t>(j, file, "hidden_size");
  c.layers = hf_value<int64_t>(j, file, "num_hidden_layers");
  c.heads = hf_value<int64_t>(j, file, "num_attention_heads");
  c.kv_heads = hf_value<int64_t>(j, file, "num_key_value_heads", c.heads);
  c.vocab = hf_value<int64_t>(j, file, "vocab_size");
  c.ffn_hidden = hf_value<int64_t>(j, file, "intermediate_size");
  c.seq = hf_value<int64_t>(j, file, "max_position_embeddings", int64_t{2048});
  c.norm_eps = hf_value<double>(j, file, "rms_norm_eps", 1e-6);
  c.tie_embeddings = hf_value<bool>(j, file, "tie_word_embeddings", false);
  if (c.heads > 0 && c.dim % c.heads == 0) {
    const int64_t hd = hf_value<int64_t>(j, file, "head_dim", c.dim / c.heads);
    if (hd != c.dim / c.heads)
      throw fsdpx::Error(file + ": head_dim " + std::to_string(hd) +
                         " differs from hidden_size / num_attention_heads = " + std::to_string(c.dim / c.heads) +
                         "; gpt's heads split the model width");
  }
  read_rope(j, file, c);
  return c;
}

// The options' ranges: beyond any model this plugin is meant for, and small enough that a plan
// (--dry-run) of the largest counts its parameters and bytes in 64 bits.
constexpr int64_t kMaxWidth = 65536, kMaxCount = 1024, kMaxVocab = int64_t{1} << 24, kMaxSeq = int64_t{1} << 20;

Config preset(const std::string& size) {
  Config c;
  if (size == "small") c = Config{256, 4, 8, 256, 128, 0, false};
  if (size == "1b") c = Config{2048, 16, 32, 32000, 2048, 0, false};
  if (size == "7b") c = Config{4096, 32, 32, 32000, 4096, 11008, false};
  if (size == "llama3-8b") c = Config{4096, 32, 32, 128256, 8192, 14336, false, 500000.0, 1e-5, 8};
  return c;
}

void check_config(Config& c) {
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.dim % c.heads != 0 || (c.dim / c.heads) % 2 != 0)
    throw fsdpx::Error("dim " + std::to_string(c.dim) + " must split into " + std::to_string(c.heads) +
                       " heads of an even size");
  if (c.heads % c.kv_heads != 0)
    throw fsdpx::Error("kv_heads " + std::to_string(c.kv_heads) + " must divide heads " + std::to_string(c.heads) +
                       " (each key/value head serves a group of query heads)");
  if (c.ffn_hidden == 0) {  // Llama's rule: 2/3 of 4 x dim, rounded up
    const int64_t multiple = c.dim >= 1024 ? 256 : 32;
    c.ffn_hidden = (8 * c.dim / 3 + multiple - 1) / multiple * multiple;
  }
  if (c.rope_theta <= 0 || c.norm_eps <= 0)
    throw fsdpx::Error("rope_theta and norm_eps must be positive, got " + std::to_string(c.rope_theta) + " and " +
                       std::to_string(c.norm_eps));
}

std::shared_ptr<Gpt> make_gpt(const fsdpx::Options& o) {
  const std::string hf = o.get_string("from_hf");
  // With from_hf the preset is not read (config.ini records only what a run read); given, it is refused.
  if (!hf.empty() && o.was_given("size"))
    throw fsdpx::Error("--model.size conflicts with --model.from_hf: the configuration comes from " + hf +
                       "/config.json; drop --model.size");
  Config c = hf.empty() ? preset(o.get_string("size")) : Config{};
  json source;
  if (!hf.empty()) {
    source = fsdpx::hf::read_config(hf);
    c = config_from_hf(source, (std::filesystem::path(hf) / "config.json").string());
  }
  auto take = [&](const char* name, int64_t& field) {
    int64_t v = o.get_int(name);  // within its declared range
    if (v > 0 && !hf.empty() && std::string(name) != "seq")
      throw fsdpx::Error("--model." + std::string(name) +
                         " conflicts with --model.from_hf: the configuration comes from " + hf + "/config.json");
    if (v > 0) field = v;
  };
  for (auto [name, field] : {std::pair<const char*, int64_t*>{"dim", &c.dim},
                             {"layers", &c.layers},
                             {"heads", &c.heads},
                             {"kv_heads", &c.kv_heads},
                             {"vocab", &c.vocab},
                             {"seq", &c.seq},
                             {"ffn_hidden", &c.ffn_hidden}})
    take(name, *field);
  if (hf.empty()) {
    c.tie_embeddings = o.get_bool("tie_embeddings");
    if (o.get_float("rope_theta") > 0) c.rope_theta = o.get_float("rope_theta");
    if (o.get_float("norm_eps") > 0) c.norm_eps = o.get_float("norm_eps");
  } else {
    // The configuration comes from config.json: a value given here would have no effect.
    for (const char* name : {"rope_theta", "norm_eps"})
      if (o.get_float(name) > 0)
        throw fsdpx::Error("--model." + std::string(name) + " conflicts with --model.from_hf: the configuration "
                           "comes from " + hf + "/config.json");
    if (o.get_bool("tie_embeddings") && !c.tie_embeddings)
      throw fsdpx::Error("--model.tie_embeddings true conflicts with --model.from_hf: " + hf +
                         "/config.json has untied embeddings (tie_word_embeddings false)");
  }
  check_config(c);
  return std::make_shared<Gpt>(c, hf, hf.empty() ? std::string() : source.dump());
}

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::Model>(
      "gpt", "Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU, causal attention",
      {fsdpx::choice_option("size", "tiny", {"tiny", "small", "1b", "7b", "llama3-8b"},
                            "preset: tiny (64x2), small (256x4), 1b (2048x16), 7b (4096x32), llama3-8b (4096x32, "
                            "8 kv heads, vocab 128256, rope_theta 500000)"),
       fsdpx::string_option("from_hf", "",
                            "a Hugging Face Llama directory: configuration from its config.json, initial weights from "
                            "its safetensors (each rank reads its own rows)"),
       fsdpx::int_option("dim", 0, {0, kMaxWidth}, "model width (0: the preset's)"),
       fsdpx::int_option("layers", 0, {0, kMaxCount}, "decoder blocks (0: the preset's)"),
       fsdpx::int_option("heads", 0, {0, kMaxCount}, "attention heads (0: the preset's)"),
       fsdpx::int_option("kv_heads", 0, {0, kMaxCount}, "key/value heads, dividing heads (0: the preset's, or heads)"),
       fsdpx::int_option("vocab", 0, {0, kMaxVocab}, "vocabulary size (0: the preset's; 256 = bytes)"),
       fsdpx::int_option("seq", 0, {0, kMaxSeq}, "context length (0: the preset's)"),
       fsdpx::int_option("ffn_hidden", 0, {0, kMaxSeq}, "SwiGLU hidden size (0: Llama's 8/3 x dim rule)"),
       fsdpx::flag_option("tie_embeddings", false, "share the input embedding with the output projection"),
       fsdpx::float_option("rope_theta", 0, fsdpx::FloatRange::at_least(0),
                           "rotary base (0: the preset's, 10000 or 500000 for llama3-8b)"),
       fsdpx::float_option("norm_eps", 0, fsdpx::FloatRange::closed(0, 1), "RMSNorm epsilon (0: the preset's, 1e-5)")},
      [](const fsdpx::ComponentContext& ctx) { return make_gpt(ctx.options); });
}

}  // namespace

FSDPX_PLUGIN("model_gpt", "0.1.0", register_components)
