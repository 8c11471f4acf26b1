// The t5 plugin's parts: its configuration (presets, Hugging Face's config.json both ways), its
// layers, and the activation memory it states. The plugin itself (fsdpx::Model and its mix-ins,
// the options) is t5.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <fsdpx/activation_memory.h>
#include <fsdpx/layer_work.h>
#include <fsdpx/unit.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace t5 {

// T5's token conventions (T5's SentencePiece vocabulary and ByT5's): the decoder starts from pad.
constexpr int64_t kPad = 0, kEos = 1, kIgnore = -100;

struct Config {
  int64_t dim = 512, head_dim = 64, ffn_hidden = 2048, layers = 6, decoder_layers = 6, heads = 8, vocab = 32128;
  int64_t buckets = 32, max_distance = 128;  // relative position buckets
  bool gated = false;                        // feed-forward: gated GELU (v1.1, flan) or ReLU (v1.0)
  bool tie_embeddings = true;                // lm_head is the shared embedding (v1.0)
  bool scale_logits = true;                  // the decoder's output times dim^-0.5 before lm_head (v1.0)
  double norm_eps = 1e-6;
  int64_t inner() const { return heads * head_dim; }
};

// --model.size: tiny (tests), and transformers' T5 configurations small, base, large, 3b, 11b
// (v1.0: ReLU, tied and scaled lm_head). Throws for another name.
Config preset(const std::string& size);
// v1.1 (and flan): gated GELU, untied lm_head without scaling.
void make_v1_1(Config& c);
// Refuses sizes that do not make a model (a zero count, heads that do not fit the buckets).
void check_config(const Config& c);

// --model.from_hf DIR: DIR/config.json (fsdpx::hf::read_config), checked to be a
// T5ForConditionalGeneration (else one line naming the architecture found). `weights` are the
// tensor names DIR's safetensors hold: whether lm_head is tied follows from them when the
// configuration leaves it open (transformers 5 writes tie_word_embeddings true for every T5).
Config config_from_hf(const nlohmann::json& j, const std::string& file, const std::vector<std::string>& weights);
// The tensor names of DIR's model.safetensors, or of the shards its index lists.
std::vector<std::string> hf_tensor_names(const std::string& dir);
// config.json for `c`: `source` (the directory's own, or empty) with the sizes written over it.
std::string hf_config_json(const Config& c, const std::string& source);
// fsdpx's parameter name to T5ForConditionalGeneration's; throws for a name t5 does not have.
std::string hf_name_of(const std::string& name);

// --- layers ------------------------------------------------------------------------------------

// T5's layer norm: RMS without mean or bias, computed in fp32 whatever the compute dtype.
struct T5LayerNormImpl : torch::nn::Module {
  T5LayerNormImpl(int64_t dim, double epsilon);
  at::Tensor forward(const at::Tensor& x);
  double eps;
  at::Tensor weight;
};
TORCH_MODULE(T5LayerNorm);

// Multi-head attention without biases or scaling (T5 folds 1/sqrt(d) into its initialisation).
// Keys and values come from `kv` (cross-attention: the encoder's output), or from `x` when `kv`
// is undefined. `bias` [1, H, Tq, Tk] is added to the scores; `blocked` (bool, broadcast to
// [B, H, Tq, Tk]) marks the pairs that may not attend.
struct T5AttentionImpl : torch::nn::Module {
  explicit T5AttentionImpl(const Config& c);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& kv, const at::Tensor& bias, const at::Tensor& blocked);
  int64_t heads, head_dim;
  at::Tensor q, k, v, o;
};
FSDPX_MODULE(T5Attention);

// ReLU (wi, wo) or gated GELU (wi_0, wi_1, wo), as T5's DenseReluDense.
struct T5FeedForwardImpl : torch::nn::Module {
  explicit T5FeedForwardImpl(const Config& c);
  at::Tensor forward(const at::Tensor& x);
  bool gated;
  at::Tensor wi, wi_0, wi_1, wo;
};
FSDPX_MODULE(T5FeedForward);

// One layer of a stack: self-attention, (decoder) cross-attention over `encoder`, feed-forward,
// each behind a layer norm with a residual. Every argument is a tensor, so that a T5Block can be
// a unit: the position bias and the masks are computed once per stack, outside the blocks.
struct T5BlockImpl : torch::nn::Module {
  T5BlockImpl(const Config& c, bool decoder);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& blocked, const at::Tensor& encoder,
                     const at::Tensor& encoder_blocked);
  bool decoder;
  T5LayerNorm self_attention_norm{nullptr}, cross_attention_norm{nullptr}, ffn_norm{nullptr};
  T5Attention self_attention{nullptr}, cross_attention{nullptr};
  T5FeedForward feed_forward{nullptr};
};
FSDPX_MODULE(T5Block);

// The relative position bucket of each (query, key) pair, [q, k] int64, as T5 computes it.
at::Tensor relative_buckets(int64_t q, int64_t k, bool bidirectional, int64_t buckets, int64_t max_distance);

// An encoder or decoder: its relative attention bias table (one per stack, shared by its
// blocks), its blocks and its final norm. Not a unit: its own parameters are the root's.
struct T5StackImpl : torch::nn::Module {
  T5StackImpl(const Config& c, bool decoder);
  // The stack on embedded tokens `h` [B, T, C]; `blocked` masks self-attention (the encoder's
  // padding, [B, 1, 1, T]); `encoder` and `encoder_blocked` for the decoder's cross-attention.
  at::Tensor forward(const at::Tensor& h, const at::Tensor& blocked, const at::Tensor& encoder,
                     const at::Tensor& encoder_blocked);
  // [1, H, q, k]: the table's value for each pair's bucket.
  at::Tensor position_bias(int64_t q, int64_t k);
  Config config;
  bool decoder;
  at::Tensor relative_attention_bias;
  torch::nn::ModuleList block{nullptr};
  std::vector<T5Block> blocks;
  T5LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(T5Stack);

struct T5Impl : torch::nn::Module {
  explicit T5Impl(const Config& c);
  // The logits [B, T, V] (compute dtype) of decoder inputs `decoder_ids` [B, T] given `source`
  // [B, S] (pad 0 is masked out of attention).
  at::Tensor forward(const at::Tensor& source, const at::Tensor& decoder_ids);
  Config config;
  at::Tensor shared, lm_head;
  T5Stack encoder{nullptr}, decoder{nullptr};
};

// The decoder's inputs for labels [B, T]: shifted right, starting from pad, -100 read as pad.
at::Tensor shift_right(const at::Tensor& labels);

// --- memory ------------------------------------------------------------------------------------

// The bytes each layer of T5 keeps for its backward, for `batch` samples of `tokens` tokens each,
// source and target together (split evenly: S = T = tokens / 2).
std::vector<fsdpx::LayerActivations> activations(const Config& c, int64_t batch, int64_t tokens,
                                                 c10::ScalarType compute);

// The work each layer of T5 does in one forward, and what its backward adds, for `batch` samples
// of `tokens` tokens (split as activations() splits them), at activations()' paths.
std::vector<fsdpx::LayerOps> layer_ops(const Config& c, int64_t batch, int64_t tokens, c10::ScalarType compute);

}  // namespace t5
