// t5: T5's encoder-decoder (transformers' T5ForConditionalGeneration): relative position bias
// computed once per stack and shared by its blocks, T5's RMS layer norm, no biases,
// cross-attention in the decoder; ReLU (v1.0) or gated-GELU (v1.1, flan) feed-forward; lm_head
// tied to the shared embedding and scaled by d_model^-0.5 (v1.0), or untied.
//
// Batches: inputs are source ids [B, S] (pad 0, masked out of attention), targets are labels
// [B, T] (-100 where there is no target token); the decoder reads the labels shifted right,
// starting from pad, as transformers does. The loss is cross-entropy over target tokens, each
// sample's mean over its own tokens, averaged over samples: the same at every world size (a mean
// over all of a batch's tokens would weigh samples by the rank they land on).
//
// Sharding: T5Block (and T5Attention, T5FeedForward) are FSDPX_MODULE layers. A unit's
// parameters exist only during its own forward and backward, so what several blocks use lives
// in the root: the shared embedding (also the tied lm_head) and each stack's relative attention
// bias table. The stack computes the bias and the masks outside its blocks and hands them in as
// tensors; decoder blocks take the encoder's output the same way.
#include "t5.h"

#include <ATen/ops/argmax.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <fsdpx/error.h>
#include <fsdpx/evaluation.h>
#include <fsdpx/hf_config.h>
#include <fsdpx/hf_interop.h>
#include <fsdpx/model.h>
#include <fsdpx/plugin.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>

namespace {

using json = nlohmann::json;
using t5::Config;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Parameters of the model's blocks and their counts (for FLOPs): encoder, decoder, the rest.
struct ParamCounts {
  int64_t encoder = 0, decoder = 0, head = 0;
};

class T5 final : public fsdpx::Model,
                 public fsdpx::Evaluable,
                 public fsdpx::HuggingFaceModel,
                 public fsdpx::ActivationMemory,
                 public fsdpx::LayerWork {
 public:
  T5(const Config& c, std::string hf_dir, std::string hf_config)
      : config_(c),
        root_(std::make_shared<t5::T5Impl>(c)),
        hf_dir_(std::move(hf_dir)),
        hf_config_(std::move(hf_config)) {
    for (const auto& p : root_->named_parameters()) {
      const int64_t n = p.value().numel();
      if (p.key().rfind("encoder.", 0) == 0)
        counts_.encoder += n;
      else if (p.key().rfind("decoder.", 0) == 0)
        counts_.decoder += n;
      else if (p.key() == "lm_head" || (p.key() == "shared" && c.tie_embeddings))
        counts_.head += n;
    }
  }
  std::shared_ptr<torch::nn::Module> module() override { return root_; }

  // T5's initialisation (transformers' _init_weights with initializer_factor 1): unit-variance
  // embeddings, projections scaled by their fan-in (the query also by the head size, which is
  // why T5's attention does not scale its scores), norms of one.
  void init_parameter(const std::string& name, at::Tensor& param, at::Generator& gen) const override {
    at::NoGradGuard no_grad;
    const double C = static_cast<double>(config_.dim), D = static_cast<double>(config_.head_dim);
    double std = std::pow(C, -0.5);  // k, v, wi, wi_0, wi_1, relative_attention_bias
    if (ends_with(name, "norm.weight")) return void(param.fill_(1.0));
    if (name == "shared" || name == "lm_head")
      std = 1.0;
    else if (ends_with(name, "attention.q"))
      std = std::pow(C * D, -0.5);
    else if (ends_with(name, "attention.o"))
      std = std::pow(static_cast<double>(config_.inner()), -0.5);
    else if (ends_with(name, "feed_forward.wo"))
      std = std::pow(static_cast<double>(config_.ffn_hidden), -0.5);
    param.normal_(0.0, std, gen);
  }

  at::Tensor loss(const fsdpx::Batch& batch) override {
    check_batch(batch);
    const at::Tensor per_sample = sample_losses(logits_of(batch.inputs, t5::shift_right(batch.targets)), batch.targets);
    return per_sample.mean();
  }

  // Held-out loss (summed over samples), and exact match: a sample counts when greedy decoding
  // reproduces its target. Greedy decoding conditions each step on the tokens it chose; while
  // they equal the target's, that is the teacher-forced forward, so decoding reproduces the
  // target exactly when the teacher-forced argmax equals the target at every target position:
  // one forward decides it, under any wrapping (see the README on why not a KV cache).
  fsdpx::EvalSums evaluate(const fsdpx::Batch& batch) override {
    fsdpx::EvalSums s;
    s.samples = batch.inputs.size(0);
    if (s.samples == 0) return s;
    check_batch(batch);
    const at::Tensor logits = logits_of(batch.inputs, t5::shift_right(batch.targets));
    s.loss_sum = sample_losses(logits, batch.targets).sum().item<double>();
    const at::Tensor wrong = (logits.argmax(-1) != batch.targets) & (batch.targets != t5::kIgnore);
    s.correct = static_cast<double>(s.samples - wrong.any(1).sum().item<int64_t>());
    return s;
  }

  std::vector<std::string> layer_types() const override { return {"T5Block", "T5Attention", "T5FeedForward"}; }
  std::vector<fsdpx::LayerActivations> activations(int64_t batch, int64_t seq, c10::ScalarType compute) const override {
    return t5::activations(config_, batch, seq, compute);
  }
  std::vector<fsdpx::LayerOps> layer_ops(int64_t batch, int64_t seq, c10::ScalarType compute) const override {
    return t5::layer_ops(config_, batch, seq, compute);
  }
  // 6 x parameters per token each stack's tokens pass through, for a sample of S + T tokens with
  // S = T (the embedding lookup is free; lm_head works on the target's tokens).
  double flops_per_token() const override {
    return 3.0 * static_cast<double>(counts_.encoder + counts_.decoder + counts_.head);
  }

  std::string hf_weights_dir() const override { return hf_dir_; }
  std::string hf_name(const std::string& name) const override { return t5::hf_name_of(name); }
  bool hf_ignorable(const std::string& name) const override {
    // The stacks' views of the shared embedding, the decoder's unused cross-attention bias table
    // (transformers ignores it too), and a tied checkpoint's copy of lm_head.
    return name == "encoder.embed_tokens.weight" || name == "decoder.embed_tokens.weight" ||
           name == "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight" ||
           (config_.tie_embeddings && name == "lm_head.weight");
  }
  std::string hf_config_json() const override { return t5::hf_config_json(config_, hf_config_); }
  // token_ids [B, L]: the encoder reads them and the decoder reads them shifted right (the
  // logits of labels = token_ids); or [2, B, L]: the encoder's ids, then the decoder's own input.
  at::Tensor hf_logits(const at::Tensor& token_ids) override {
    if (token_ids.dim() == 3 && token_ids.size(0) == 2) return logits_of(token_ids[0], token_ids[1]);
    return logits_of(token_ids, t5::shift_right(token_ids));
  }

 private:
  // Each sample's mean cross-entropy over its target tokens (0 for a sample without any), fp32.
  static at::Tensor sample_losses(const at::Tensor& logits, const at::Tensor& labels) {
    const int64_t B = labels.size(0);
    const at::Tensor per_token = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}), {},
                                                        at::Reduction::None, t5::kIgnore)
                                     .view({B, -1});
    const at::Tensor count = (labels != t5::kIgnore).sum(1).clamp_min(1).to(at::kFloat);
    return per_token.sum(1) / count;
  }

  void check_batch(const fsdpx::Batch& b) const {
    if (b.inputs.dim() != 2 || b.targets.dim() != 2 || b.inputs.size(0) != b.targets.size(0))
      throw fsdpx::Error(
          "t5 expects source ids [batch, source length] and labels [batch, target length], the data "
          "gives " +
          c10::str(b.inputs.sizes()) + " and " + c10::str(b.targets.sizes()) +
          "; choose a token data source (seq2seq, text, tokens, synthetic)");
    if (b.targets.numel() > 0 && (b.targets.max().item<int64_t>() >= config_.vocab ||
                                  ((b.targets < 0) & (b.targets != t5::kIgnore)).any().item<bool>()))
      throw fsdpx::Error("the data's labels hold ids outside the model's vocabulary of " +
                         std::to_string(config_.vocab) + " (other than -100, which marks no target): largest " +
                         std::to_string(b.targets.max().item<int64_t>()) + "; set --model.vocab larger");
  }

  at::Tensor logits_of(const at::Tensor& source, const at::Tensor& decoder_ids) {
    for (const at::Tensor* t : {&source, &decoder_ids}) {
      if (t->dim() != 2 || t->scalar_type() != at::kLong)
        throw fsdpx::Error("t5 expects int64 token ids of shape [batch, length], got " + c10::str(t->sizes()));
      if (t->numel() == 0) continue;
      const int64_t hi = t->max().item<int64_t>(), lo = t->min().item<int64_t>();
      if (hi >= config_.vocab || lo < 0)
        throw fsdpx::Error("the data holds token id " + std::to_string(hi >= config_.vocab ? hi : lo) +
                           ", outside the model's vocabulary of " + std::to_string(config_.vocab) +
                           (lo < 0 ? "" : "; set --model.vocab " + std::to_string(hi + 1) + " or more"));
    }
    return root_->forward(source, decoder_ids).to(at::kFloat);
  }

  Config config_;
  std::shared_ptr<t5::T5Impl> root_;
  std::string hf_dir_, hf_config_;  // --model.from_hf and its config.json as read
  ParamCounts counts_;
};

// The options' ranges: beyond T5 11B's sizes, small enough that a plan counts its bytes in 64 bits.
constexpr int64_t kMaxWidth = 65536, kMaxFfn = 1 << 20, kMaxCount = 1024, kMaxVocab = int64_t{1} << 24;

void apply_sizes(const fsdpx::Options& o, const std::string& hf, Config& c) {
  const std::pair<const char*, int64_t*> sizes[] = {{"dim", &c.dim},
                                                    {"head_dim", &c.head_dim},
                                                    {"ffn_hidden", &c.ffn_hidden},
                                                    {"layers", &c.layers},
                                                    {"decoder_layers", &c.decoder_layers},
                                                    {"heads", &c.heads},
                                                    {"vocab", &c.vocab},
                                                    {"buckets", &c.buckets},
                                                    {"max_distance", &c.max_distance}};
  const bool layers_given = o.get_int("layers") > 0;
  for (auto [name, field] : sizes) {
    const int64_t v = o.get_int(name);  // within its declared range
    if (v > 0 && !hf.empty())
      throw fsdpx::Error("--model." + std::string(name) +
                         " conflicts with --model.from_hf: the configuration comes from " + hf + "/config.json");
    if (v > 0) *field = v;
  }
  // --model.layers alone sets both stacks, as transformers' num_layers does.
  if (layers_given && o.get_int("decoder_layers") == 0) c.decoder_layers = c.layers;
  if (o.get_float("norm_eps") > 0) {
    if (!hf.empty())
      throw fsdpx::Error("--model.norm_eps conflicts with --model.from_hf: it comes from " + hf + "/config.json");
    c.norm_eps = o.get_float("norm_eps");
  }
}

std::shared_ptr<T5> make_t5(const fsdpx::Options& o) {
  const std::string hf = o.get_string("from_hf");
  // With from_hf the preset and the variant are not read (config.ini records only what a run read);
  // given, they are refused.
  for (const char* name : {"size", "variant"})
    if (!hf.empty() && o.was_given(name))
      throw fsdpx::Error("--model." + std::string(name) + " conflicts with --model.from_hf: the configuration "
                         "comes from " + hf + "/config.json; drop --model." + name);
  Config c;
  json source;
  if (hf.empty()) {
    c = t5::preset(o.get_string("size"));
    if (o.get_string("variant") == "v1.1") t5::make_v1_1(c);
  } else {
    source = fsdpx::hf::read_config(hf);
    c = t5::config_from_hf(source, (std::filesystem::path(hf) / "config.json").string(), t5::hf_tensor_names(hf));
  }
  apply_sizes(o, hf, c);
  t5::check_config(c);
  return std::make_shared<T5>(c, hf, hf.empty() ? std::string() : source.dump());
}

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::Model>(
      "t5",
      "T5 encoder-decoder (T5ForConditionalGeneration): relative position bias, T5Block layers, ReLU or gated GELU",
      {fsdpx::choice_option(
           "size", "tiny", {"tiny", "small", "base", "large", "3b", "11b"},
           "preset: tiny (64 wide, 2+2 blocks, vocab 384), or transformers' T5 sizes small (60M), base "
           "(220M), large (770M), 3b, 11b"),
       fsdpx::choice_option("variant", "v1.0", {"v1.0", "v1.1"},
                            "v1.0: ReLU, lm_head tied and scaled by dim^-0.5; v1.1 (flan): gated GELU, untied lm_head"),
       fsdpx::string_option("from_hf", "",
                            "a Hugging Face T5ForConditionalGeneration directory: configuration from its config.json, "
                            "initial weights from its safetensors (each rank reads its own rows)"),
       fsdpx::int_option("dim", 0, {0, kMaxWidth}, "d_model (0: the preset's)"),
       fsdpx::int_option("head_dim", 0, {0, kMaxWidth}, "d_kv, the width of one head (0: the preset's)"),
       fsdpx::int_option("ffn_hidden", 0, {0, kMaxFfn}, "d_ff (0: the preset's)"),
       fsdpx::int_option("layers", 0, {0, kMaxCount},
                         "encoder blocks, and decoder blocks unless decoder_layers (0: preset)"),
       fsdpx::int_option("decoder_layers", 0, {0, kMaxCount}, "decoder blocks (0: as many as the encoder)"),
       fsdpx::int_option("heads", 0, {0, kMaxCount}, "attention heads (0: the preset's)"),
       fsdpx::int_option("vocab", 0, {0, kMaxVocab}, "vocabulary size (0: the preset's; 259 or more for bytes)"),
       fsdpx::int_option("buckets", 0, {0, 4096}, "relative position buckets (0: 32)"),
       fsdpx::int_option("max_distance", 0, {0, 1 << 20}, "distance of the last relative position bucket (0: 128)"),
       fsdpx::float_option("norm_eps", 0, fsdpx::FloatRange::closed(0, 1), "layer norm epsilon (0: 1e-6)")},
      [](const fsdpx::ComponentContext& ctx) { return make_t5(ctx.options); });
}

}  // namespace

FSDPX_PLUGIN("model_t5", "0.1.0", register_components)
