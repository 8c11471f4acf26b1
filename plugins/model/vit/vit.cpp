// vit: a vision transformer for image classification (Dosovitskiy et al.), and DeepViT (Zhou et
// al.) as --model.reattention. Images [B, C, H, W] are cut into patches, each flattened in
// (channel, row, column) order and projected to the width (a convolution with stride = kernel =
// patch, as Hugging Face's ViT has it: the weight is [dim, C, P, P]); a class token leads the
// patches and learned position embeddings are added; pre-norm blocks of multi-head self-attention
// and a GELU MLP follow, then a LayerNorm, and a linear head classifies the class token.
//
// It is Hugging Face's ViTForImageClassification (--model.from_hf, fsdpx-ckpt export-hf), and with
// --model.patch_norms, --model.qkv_bias false and --model.norm_eps 1e-5 it is vit-pytorch's ViT
// (reattention: its DeepViT) under other names (tests/hf/vit_interop_test.py maps them).
// Dropout is not implemented (vit-pytorch's default of 0).
//
// Parameters are deferred (fsdpx::deferred_tensor): even the 8B DeepViT plans in an instant.
// Block, Attention, FeedForward and PatchEmbedding are declared with FSDPX_MODULE: any can be a unit.
#include <cmath>

#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/einsum.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/softmax.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/container/modulelist.h>

#include <fsdpx/activation_memory.h>
#include <fsdpx/error.h>
#include <fsdpx/evaluation.h>
#include <fsdpx/float8.h>
#include <fsdpx/hf_interop.h>
#include <fsdpx/linear.h>
#include <fsdpx/model.h>
#include <fsdpx/plugin.h>
#include <fsdpx/unit.h>

#include "vit.h"

namespace {

using vit::Config;
using json = nlohmann::json;

at::Tensor deferred(at::IntArrayRef shape) { return fsdpx::deferred_tensor(shape); }

at::Tensor affine(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return b.defined() ? fsdpx::linear(x, w) + b : fsdpx::linear(x, w);
}

struct LayerNormImpl : torch::nn::Module {
  LayerNormImpl(int64_t width, double epsilon) : torch::nn::Module("LayerNorm"), eps(epsilon) {
    weight = register_parameter("weight", deferred({width}));
    bias = register_parameter("bias", deferred({width}));
  }
  at::Tensor forward(const at::Tensor& x) { return at::layer_norm(x, {weight.size(0)}, weight, bias, eps); }
  double eps;
  at::Tensor weight, bias;
};
TORCH_MODULE(LayerNorm);

// A weight of `shape` ([out, ...]) and a bias [out]: the patch projection and the head.
struct ProjectionImpl : torch::nn::Module {
  explicit ProjectionImpl(at::IntArrayRef shape) : torch::nn::Module("Projection") {
    weight = register_parameter("weight", deferred(shape));
    bias = register_parameter("bias", deferred({shape[0]}));
  }
  at::Tensor forward(const at::Tensor& x) { return affine(x, weight.reshape({weight.size(0), -1}), bias); }
  at::Tensor weight, bias;
};
TORCH_MODULE(Projection);

// Patches, projection, class token and position embeddings: tokens [B, 1 + patches, dim].
struct PatchEmbeddingImpl : torch::nn::Module {
  PatchEmbeddingImpl(const Config& c) : torch::nn::Module("PatchEmbedding"), config(c) {
    if (c.patch_norms) norm_in = register_module("norm_in", LayerNorm(c.patch_dim(), c.norm_eps));
    proj = register_module("proj", Projection(std::vector<int64_t>{c.dim, c.channels, c.patch, c.patch}));
    if (c.patch_norms) norm_out = register_module("norm_out", LayerNorm(c.dim, c.norm_eps));
    cls_token = register_parameter("cls_token", deferred({1, 1, c.dim}));
    pos_embedding = register_parameter("pos_embedding", deferred({1, c.tokens(), c.dim}));
  }
  at::Tensor forward(const at::Tensor& images) {
    const int64_t B = images.size(0), C = config.channels, P = config.patch, G = config.grid();
    // [B, C, G*P, G*P] -> [B, G*G, C*P*P]: patch (row, column) major, each in (channel, row, column).
    at::Tensor x = images.reshape({B, C, G, P, G, P}).permute({0, 2, 4, 1, 3, 5}).reshape({B, G * G, C * P * P});
    if (norm_in) x = norm_in(x);
    x = proj(x);
    if (norm_out) x = norm_out(x);
    x = at::cat({cls_token.expand({B, 1, config.dim}), x}, 1);
    return x + pos_embedding;
  }
  Config config;
  LayerNorm norm_in{nullptr}, norm_out{nullptr};
  Projection proj{nullptr};
  at::Tensor cls_token, pos_embedding;
};
FSDPX_MODULE(PatchEmbedding);

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const Config& c) : torch::nn::Module("Attention"), heads(c.heads) {
    const int64_t I = c.inner();
    for (auto [w, b, n] : {std::tuple{&wq, &bq, "q"}, {&wk, &bk, "k"}, {&wv, &bv, "v"}}) {
      *w = register_parameter(std::string("w") + n, deferred({I, c.dim}));
      if (c.qkv_bias) *b = register_parameter(std::string("b") + n, deferred({I}));
    }
    wo = register_parameter("wo", deferred({c.dim, I}));
    bo = register_parameter("bo", deferred({c.dim}));
    if (c.reattention) {
      reattn_weights = register_parameter("reattn_weights", deferred({c.heads, c.heads}));
      reattn_norm = register_module("reattn_norm", LayerNorm(c.heads, c.norm_eps));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), I = wq.size(0), D = I / heads;
    auto split = [&](const at::Tensor& t) { return t.view({B, T, heads, D}).transpose(1, 2); };
    const at::Tensor q = split(affine(x, wq, bq)), k = split(affine(x, wk, bk)), v = split(affine(x, wv, bv));
    at::Tensor y;
    if (!reattention()) {
      y = at::scaled_dot_product_attention(q, k, v);
    } else {
      // Re-attention: softmax(q k^T / sqrt(D)) [B, H, T, T], its heads mixed by the H x H matrix
      // (head h of the input feeds head g of the output with weight [h, g]), normalised over the
      // heads at each (i, j), then applied to the values.
      const at::Tensor maps = at::softmax(at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(D)), -1);
      const at::Tensor mixed = at::einsum("bhij,hg->bgij", {maps, reattn_weights});
      y = at::matmul(reattn_norm(mixed.permute({0, 2, 3, 1})).permute({0, 3, 1, 2}), v);
    }
    return affine(y.transpose(1, 2).reshape({B, T, I}), wo, bo);
  }
  bool reattention() const { return reattn_weights.defined(); }
  int64_t heads;
  at::Tensor wq, wk, wv, bq, bk, bv, wo, bo, reattn_weights;
  LayerNorm reattn_norm{nullptr};
};
FSDPX_MODULE(Attention);

struct FeedForwardImpl : torch::nn::Module {
  FeedForwardImpl(int64_t dim, int64_t hidden) : torch::nn::Module("FeedForward") {
    w1 = register_parameter("w1", deferred({hidden, dim}));
    b1 = register_parameter("b1", deferred({hidden}));
    w2 = register_parameter("w2", deferred({dim, hidden}));
    b2 = register_parameter("b2", deferred({dim}));
  }
  at::Tensor forward(const at::Tensor& x) { return affine(at::gelu(affine(x, w1, b1)), w2, b2); }
  at::Tensor w1, b1, w2, b2;
};
FSDPX_MODULE(FeedForward);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const Config& c) : torch::nn::Module("Block") {
    attention_norm = register_module("attention_norm", LayerNorm(c.dim, c.norm_eps));
    attention = register_module("attention", Attention(c));
    mlp_norm = register_module("mlp_norm", LayerNorm(c.dim, c.norm_eps));
    mlp = register_module("mlp", FeedForward(c.dim, c.mlp));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = x + attention(attention_norm(x));
    return h + mlp(mlp_norm(h));
  }
  LayerNorm attention_norm{nullptr}, mlp_norm{nullptr};
  Attention attention{nullptr};
  FeedForward mlp{nullptr};
};
FSDPX_MODULE(Block);

struct VisionTransformerImpl : torch::nn::Module {
  VisionTransformerImpl(const Config& c) : torch::nn::Module("VisionTransformer") {
    embeddings = register_module("embeddings", PatchEmbedding(c));
    list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks.push_back(Block(c));
      list->push_back(blocks.back());
    }
    norm = register_module("norm", LayerNorm(c.dim, c.norm_eps));
    head = register_module("head", Projection(std::vector<int64_t>{c.classes, c.dim}));
  }
  // The class token's logits: a LayerNorm acts on each token alone, so normalising the class token
  // alone is vit-pytorch's ViT (all tokens, then the first) and its DeepViT (the first, then normed).
  at::Tensor forward(const at::Tensor& images) {
    at::Tensor x = embeddings(images);
    for (auto& block : blocks) x = block(x);
    const at::Tensor cls = norm(x.select(1, 0));  // the logits stay in the compute dtype under float8
    return fsdpx::output_linear(cls, head->weight) + head->bias;
  }
  PatchEmbedding embeddings{nullptr};
  torch::nn::ModuleList list{nullptr};
  std::vector<Block> blocks;
  LayerNorm norm{nullptr};
  Projection head{nullptr};
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A bias: "...bias", or a projection's ("attention.bq", "mlp.b1").
bool is_bias(const std::string& name) {
  const std::string last = name.substr(name.rfind('.') + 1);
  return last == "bias" || (last.size() == 2 && last[0] == 'b');
}

std::vector<fsdpx::LayerActivations> vit_activations(const Config& c, int64_t batch, c10::ScalarType compute);

class Vit final : public fsdpx::Model,
                  public fsdpx::Evaluable,
                  public fsdpx::HuggingFaceModel,
                  public fsdpx::ActivationMemory {
 public:
  Vit(const Config& c, std::string hf_dir, json hf_source)
      : config_(c),
        root_(std::make_shared<VisionTransformerImpl>(c)),
        hf_dir_(std::move(hf_dir)),
        hf_source_(std::move(hf_source)) {}
  std::shared_ptr<torch::nn::Module> module() override { return root_; }

  void init_parameter(const std::string& name, at::Tensor& param, at::Generator& gen) const override {
    at::NoGradGuard no_grad;
    // LayerNorms start as the identity, biases at zero; the rest as Hugging Face's ViT initialises
    // them (a normal of 0.02; its truncation at 2 standard deviations is left out). The
    // re-attention matrix starts as the identity plus that noise, so that each head first keeps its map.
    if (ends_with(name, "norm.weight") || ends_with(name, "norm_in.weight") || ends_with(name, "norm_out.weight")) {
      param.fill_(1.0);
    } else if (is_bias(name)) {
      param.zero_();
    } else {
      param.normal_(0.0, 0.02, gen);
      if (ends_with(name, "reattn_weights")) param.add_(at::eye(param.size(0), param.options()));
    }
  }

  at::Tensor loss(const fsdpx::Batch& batch) override {
    return at::cross_entropy_loss(logits_of(batch.inputs), labels_of(batch));
  }

  fsdpx::EvalSums evaluate(const fsdpx::Batch& batch) override {
    fsdpx::EvalSums s;
    s.samples = batch.inputs.size(0);
    s.correct = 0;
    if (s.samples == 0) return s;
    const at::Tensor l = logits_of(batch.inputs), y = labels_of(batch);
    s.loss_sum = at::cross_entropy_loss(l, y, {}, at::Reduction::Sum).item<double>();
    s.correct = at::argmax(l, 1).eq(y).sum().item<double>();
    return s;
  }

  std::vector<std::string> layer_types() const override {
    return {"Block", "Attention", "FeedForward", "PatchEmbedding"};
  }
  std::vector<fsdpx::LayerActivations> activations(int64_t batch, int64_t, c10::ScalarType compute) const override {
    return vit_activations(config_, batch, compute);
  }
  // Training FLOPs per image (an image is a sample's one "token"): 6 per weight of each matrix
  // product per token it sees (the blocks' and the patch projection's over their tokens, the
  // head's over the class token), plus attention's two products per head, forward and backward
  // (12*L*I*T per token), and re-attention's mixing of the maps (6*L*H*H*T per token).
  double flops_per_token() const override {
    const Config& c = config_;
    const double T = static_cast<double>(c.tokens()), L = static_cast<double>(c.layers);
    const double I = static_cast<double>(c.inner()), C = static_cast<double>(c.dim), H = static_cast<double>(c.heads);
    const double block_weights = 4.0 * I * C + 2.0 * C * static_cast<double>(c.mlp);
    double f = 6.0 * (L * block_weights * T + C * static_cast<double>(c.patch_dim() * c.patches()) +
                      static_cast<double>(c.classes) * C);
    f += 12.0 * L * I * T * T;
    if (c.reattention) f += 6.0 * L * H * H * T * T;
    return f;
  }

  std::string hf_weights_dir() const override { return hf_dir_; }
  std::string hf_name(const std::string& name) const override { return vit::hf_name_of(name); }
  bool hf_ignorable(const std::string& name) const override {
    return name.rfind("vit.pooler.", 0) == 0;  // ViTModel's pooler, unused by the classifier
  }
  std::string hf_config_json() const override {
    const Config& c = config_;
    if (c.reattention || c.patch_norms || c.inner() != c.dim)
      throw fsdpx::Error(
          "this vit has no Hugging Face counterpart: ViTForImageClassification has no re-attention, "
          "no patch norms, and heads that split the width (here reattention " +
          std::to_string(c.reattention) + ", patch_norms " + std::to_string(c.patch_norms) + ", heads x head_dim " +
          std::to_string(c.inner()) + " against dim " + std::to_string(c.dim) +
          "); save it as an fsdpx checkpoint instead");
    return vit::hf_config_json(c, hf_source_);
  }
  at::Tensor hf_logits(const at::Tensor& pixel_values) override { return logits_of(pixel_values); }

 private:
  at::Tensor logits_of(const at::Tensor& images) {
    const Config& c = config_;
    if (images.dim() != 4 || images.size(1) != c.channels || images.size(2) != c.image || images.size(3) != c.image)
      throw fsdpx::Error("vit expects images [batch, " + std::to_string(c.channels) + ", " + std::to_string(c.image) +
                         ", " + std::to_string(c.image) + "], the data gives " + c10::str(images.sizes()) +
                         "; choose an image data source (images) or set --model.channels and --model.image to the "
                         "data's");
    const at::Tensor& w = root_->embeddings->proj->weight;  // the images in the compute dtype
    return root_->forward(images.to(w.scalar_type())).to(at::kFloat);
  }
  at::Tensor labels_of(const fsdpx::Batch& batch) const {
    const at::Tensor& y = batch.targets;
    if (y.dim() != 1 || y.size(0) != batch.inputs.size(0))
      throw fsdpx::Error("vit expects one class label per image, the data gives labels " + c10::str(y.sizes()) +
                         " for " + std::to_string(batch.inputs.size(0)) + " images");
    if (y.numel() > 0) {
      const int64_t hi = y.max().item<int64_t>(), lo = y.min().item<int64_t>();
      if (lo < 0 || hi >= config_.classes)
        throw fsdpx::Error("vit has " + std::to_string(config_.classes) + " classes (labels 0.." +
                           std::to_string(config_.classes - 1) + ") but the data has label " +
                           std::to_string(lo < 0 ? lo : hi) + "; set --model.classes " + std::to_string(hi + 1));
    }
    return y;
  }

  Config config_;
  std::shared_ptr<VisionTransformerImpl> root_;
  std::string hf_dir_;
  json hf_source_;
};

// The bytes each layer keeps for its backward and holds at its worst moments, from the tensors
// LibTorch's autograd saves for the ops above (N = B*T tokens, width C, inner I, MLP F, heads H,
// e bytes per compute element; a LayerNorm keeps its input and fp32 mean and reciprocal deviation,
// and its output is kept by the projections after it).
std::vector<fsdpx::LayerActivations> vit_activations(const Config& c, int64_t batch, c10::ScalarType compute) {
  const int64_t B = batch, T = c.tokens(), N = B * T, C = c.dim, I = c.inner(), F = c.mlp, H = c.heads;
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute)), x = N * C * e;
  auto norm = [&](const std::string& path, int64_t width_bytes, int64_t rows) {
    return fsdpx::LayerActivations{path, 2 * width_bytes + 8 * rows, width_bytes, 0, 4 * width_bytes + 8 * rows};
  };
  std::vector<fsdpx::LayerActivations> out;
  // Patches: the permuted copy (kept by the projection, or by the first norm), the projection's output
  // (kept by the second norm, when there is one), the concatenation and the sum (temporaries).
  const int64_t patches = B * c.patches() * c.patch_dim() * e;
  const int64_t embed_saved = patches + (c.patch_norms ? patches + 8 * B * c.patches() + 2 * x : 0);
  out.push_back({"embeddings", embed_saved, patches, 2 * x, embed_saved + 2 * x});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    out.push_back(norm(p + "attention_norm", x, N));
    // q, k, v and the output: the CPU's flash attention writes it [B, T, H, D] in memory, so the
    // output projection's input is a view of it; it keeps the fp32 log-sum-exp. Re-attention keeps
    // q, k and v, the maps, their mix and its normalised copy (with fp32 statistics), and the
    // [B, T, H, D] copy of the output the projection takes. The backward holds the gradients of
    // the output, q, k, v and the projections' input (5 N I), and with re-attention one map's.
    const int64_t qkvo = 4 * N * I * e, maps = B * H * T * T * e;
    const int64_t attn_saved = c.reattention ? qkvo + 4 * maps + 8 * B * T * T : qkvo + 4 * N * H;
    out.push_back(
        {p + "attention", attn_saved, x, 3 * N * I * e, attn_saved + 5 * N * I * e + (c.reattention ? maps : 0)});
    out.push_back(norm(p + "mlp_norm", x, N));
    // w1's output (kept by GELU) and GELU's (kept by w2); the backward holds two N x F gradients.
    out.push_back({p + "mlp", 2 * N * F * e, x, 0, 4 * N * F * e + x});
  }
  // The final norm sees the class tokens alone; the loss keeps fp32 log-probabilities.
  const int64_t cls = B * C * e, logits = 4 * B * c.classes;
  out.push_back(norm("norm", cls, B));
  out.push_back({"head", logits, cls, logits, 3 * logits + cls});
  return out;
}

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::Model>("vit", "vision transformer for image classification (ViT; DeepViT's re-attention as an option)",
                      vit::options(), [](const fsdpx::ComponentContext& ctx) {
                        json source;
                        const Config c = vit::config_of(ctx.options, &source);
                        return std::make_shared<Vit>(c, ctx.options.get_string("from_hf"), source);
                      });
}

}  // namespace

FSDPX_PLUGIN("model_vit", "0.1.0", register_components)
