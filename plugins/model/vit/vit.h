// vit: a vision transformer for image classification, and DeepViT as its re-attention option.
// The configuration, its presets and options, and its Hugging Face counterpart
// (ViTForImageClassification): names and config.json, read and written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <fsdpx/options.h>

namespace vit {

struct Config {
  int64_t image = 8, patch = 2, channels = 1, classes = 10;
  int64_t dim = 64, layers = 2, heads = 4;
  int64_t head_dim = 0;  // 0: dim / heads. vit-pytorch's dim_head; heads * head_dim need not be dim
  int64_t mlp = 0;       // 0: 4 x dim
  // DeepViT's re-attention: each block's attention maps mixed across heads by a learned H x H
  // matrix, then layer-normalised over the heads, before they weight the values.
  bool reattention = false;
  // vit-pytorch's patch embedding: a LayerNorm over each flattened patch before the projection
  // and one over the width after it. Hugging Face's ViT has neither.
  bool patch_norms = false;
  bool qkv_bias = true;  // Hugging Face's ViT: true; vit-pytorch: false
  double norm_eps = 1e-12;

  int64_t grid() const { return image / patch; }
  int64_t patches() const { return grid() * grid(); }
  int64_t tokens() const { return patches() + 1; }  // the class token first
  int64_t inner() const { return heads * head_dim; }
  int64_t patch_dim() const { return channels * patch * patch; }
};

// The plugin's options, and the configuration they give (a preset, a Hugging Face directory's
// config.json under from_hf, then the options given); fsdpx::Error naming what does not fit.
std::vector<fsdpx::OptionSpec> options();
Config config_of(const fsdpx::Options& o, nlohmann::json* hf_source);

// The Hugging Face name of an fsdpx parameter ("blocks.0.attention.wq" ->
// "vit.encoder.layer.0.attention.attention.query.weight"); fsdpx::Error for one it lacks.
std::string hf_name_of(const std::string& name);
// config.json for `c`: `source`'s keys kept (from_hf), the sizes written over them.
std::string hf_config_json(const Config& c, const nlohmann::json& source);

}  // namespace vit
