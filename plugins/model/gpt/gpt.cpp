// gpt: a Llama-style decoder. RMSNorm, rotary position embeddings, SwiGLU MLP, causal attention
// through at::scaled_dot_product_attention, optionally tied input/output embeddings.
//
// Parameters are created deferred (fsdpx::deferred_tensor): nothing is allocated until the
// sharding engine materialises them one at a time (init_parameter), so even the 7b size plans
// in an instant.
// Block, Attention and FeedForward are declared with FSDPX_MODULE: any of them can be a unit.
#include <cmath>

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <torch/nn/modules/container/modulelist.h>

#include <fsdpx/error.h>
#include <fsdpx/evaluation.h>
#include <fsdpx/model.h>
#include <fsdpx/plugin.h>
#include <fsdpx/unit.h>

namespace {

struct Config {
  int64_t dim = 64, layers = 2, heads = 4, vocab = 256, seq = 64, ffn_hidden = 0;
  bool tie_embeddings = false;
  double rope_theta = 10000.0, norm_eps = 1e-5;
};

at::Tensor deferred(at::IntArrayRef shape) { return fsdpx::deferred_tensor(shape); }

struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double epsilon) : torch::nn::Module("RMSNorm"), eps(epsilon) {
    weight = register_parameter("weight", deferred({dim}));
  }
  at::Tensor forward(const at::Tensor& x) {
    return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
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
  AttentionImpl(const Config& c) : torch::nn::Module("Attention"), heads(c.heads), theta(c.rope_theta) {
    wq = register_parameter("wq", deferred({c.dim, c.dim}));
    wk = register_parameter("wk", deferred({c.dim, c.dim}));
    wv = register_parameter("wv", deferred({c.dim, c.dim}));
    wo = register_parameter("wo", deferred({c.dim, c.dim}));
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / heads;
    auto split = [&](const at::Tensor& t) { return t.view({B, T, heads, D}).transpose(1, 2); };
    at::Tensor q = split(at::linear(x, wq)), k = split(at::linear(x, wk)), v = split(at::linear(x, wv));
    at::Tensor inv = at::pow(theta, -at::arange(0, D, 2, x.options()) / static_cast<double>(D));
    at::Tensor angles = at::outer(at::arange(T, x.options()), inv);
    at::Tensor cos = angles.cos(), sin = angles.sin();
    q = rotate(q, cos, sin);
    k = rotate(k, cos, sin);
    at::Tensor y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
    return at::linear(y.transpose(1, 2).reshape({B, T, C}), wo);
  }
  int64_t heads;
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
  at::Tensor forward(const at::Tensor& x) { return at::linear(at::silu(at::linear(x, w1)) * at::linear(x, w3), w2); }
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

struct TransformerImpl : torch::nn::Module {
  TransformerImpl(const Config& c) : torch::nn::Module("Transformer"), config(c) {
    tok_embeddings = register_parameter("tok_embeddings", deferred({c.vocab, c.dim}));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks.push_back(Block(c));
      layers->push_back(blocks.back());
    }
    norm = register_module("norm", RMSNorm(c.dim, c.norm_eps));
    if (!c.tie_embeddings) output = register_parameter("output", deferred({c.vocab, c.dim}));
  }
  at::Tensor forward(const at::Tensor& tokens) {
    at::Tensor h = at::embedding(tok_embeddings, tokens);
    for (auto& block : blocks) h = block(h);
    return at::linear(norm(h), config.tie_embeddings ? tok_embeddings : output);
  }
  Config config;
  at::Tensor tok_embeddings, output;
  torch::nn::ModuleList layers{nullptr};
  std::vector<Block> blocks;
  RMSNorm norm{nullptr};
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class Gpt final : public fsdpx::Model, public fsdpx::Evaluable {
 public:
  explicit Gpt(const Config& c) : config_(c), root_(std::make_shared<TransformerImpl>(c)) {
    for (const auto& p : root_->parameters()) params_ += p.numel();
  }
  std::shared_ptr<torch::nn::Module> module() override { return root_; }

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
    at::Tensor logits = logits_of(batch);
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape({-1}));
  }

  // The loss summed over samples (each sample's mean over its tokens), for held-out evaluation.
  fsdpx::EvalSums evaluate(const fsdpx::Batch& batch) override {
    fsdpx::EvalSums s;
    s.samples = batch.inputs.size(0);
    if (s.samples == 0) return s;
    at::Tensor logits = logits_of(batch);
    s.loss_sum = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape({-1})).item<double>() *
                 static_cast<double>(s.samples);
    return s;
  }

  std::vector<std::string> layer_types() const override { return {"Block", "Attention", "FeedForward"}; }
  double flops_per_token() const override { return 6.0 * static_cast<double>(params_); }

 private:
  at::Tensor logits_of(const fsdpx::Batch& batch) {
    const at::Tensor& t = batch.inputs;
    if (t.dim() != 2)
      throw fsdpx::Error("gpt expects token ids of shape [batch, seq], the data gives " + c10::str(t.sizes()) +
                         "; choose a token data source (text, tokens, synthetic)");
    if (t.size(1) > config_.seq)
      throw fsdpx::Error("the data's sequences have " + std::to_string(t.size(1)) + " tokens, more than the model's context of " +
                         std::to_string(config_.seq) + "; set --data.seq " + std::to_string(config_.seq) +
                         " or less, or --model.seq " + std::to_string(t.size(1)) + " or more");
    if (t.numel() > 0) {
      const int64_t hi = t.max().item<int64_t>();
      if (hi >= config_.vocab)
        throw fsdpx::Error("the data holds token id " + std::to_string(hi) + ", outside the model's vocabulary of " +
                           std::to_string(config_.vocab) + "; set --model.vocab " + std::to_string(hi + 1) + " or more");
    }
    return root_->forward(t).to(at::kFloat);
  }

  Config config_;
  std::shared_ptr<TransformerImpl> root_;
  int64_t params_ = 0;
};

Config config_from(const fsdpx::Options& o) {
  Config c;
  const std::string size = o.get_string("size");
  if (size == "tiny") c = Config{64, 2, 4, 256, 64, 0, false};
  if (size == "small") c = Config{256, 4, 8, 256, 128, 0, false};
  if (size == "1b") c = Config{2048, 16, 32, 32000, 2048, 0, false};
  if (size == "7b") c = Config{4096, 32, 32, 32000, 4096, 11008, false};
  auto take = [&](const char* name, int64_t& field) {
    int64_t v = o.get_int(name);
    if (v < 0) throw fsdpx::Error(std::string(name) + " must be positive, got " + std::to_string(v));
    if (v > 0) field = v;
  };
  take("dim", c.dim);
  take("layers", c.layers);
  take("heads", c.heads);
  take("vocab", c.vocab);
  take("seq", c.seq);
  take("ffn_hidden", c.ffn_hidden);
  c.tie_embeddings = o.get_bool("tie_embeddings");
  if (c.dim % c.heads != 0 || (c.dim / c.heads) % 2 != 0)
    throw fsdpx::Error("dim " + std::to_string(c.dim) + " must split into " + std::to_string(c.heads) +
                       " heads of an even size");
  if (c.ffn_hidden == 0) {  // Llama's rule: 2/3 of 4 x dim, rounded up
    const int64_t multiple = c.dim >= 1024 ? 256 : 32;
    c.ffn_hidden = (8 * c.dim / 3 + multiple - 1) / multiple * multiple;
  }
  return c;
}

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::Model>(
      "gpt", "Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU, causal attention",
      {fsdpx::choice_option("size", "tiny", {"tiny", "small", "1b", "7b"},
                            "preset: tiny (64x2), small (256x4), 1b (2048x16), 7b (4096x32)"),
       fsdpx::int_option("dim", 0, "model width (0: the preset's)"),
       fsdpx::int_option("layers", 0, "decoder blocks (0: the preset's)"),
       fsdpx::int_option("heads", 0, "attention heads (0: the preset's)"),
       fsdpx::int_option("vocab", 0, "vocabulary size (0: the preset's; 256 = bytes)"),
       fsdpx::int_option("seq", 0, "context length (0: the preset's)"),
       fsdpx::int_option("ffn_hidden", 0, "SwiGLU hidden size (0: Llama's 8/3 x dim rule)"),
       fsdpx::flag_option("tie_embeddings", false, "share the input embedding with the output projection")},
      [](const fsdpx::ComponentContext& ctx) { return std::make_shared<Gpt>(config_from(ctx.options)); });
}

}  // namespace

FSDPX_PLUGIN("model_gpt", "0.1.0", register_components)
