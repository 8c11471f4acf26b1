// vit's configuration: presets, options, and Hugging Face ViT's config.json and names.
#include <filesystem>
#include <regex>

#include <fsdpx/error.h>
#include <fsdpx/hf_config.h>

#include "vit.h"

namespace vit {

namespace {

using json = nlohmann::json;

// The options' ranges: beyond any model this plugin is meant for, and small enough that a plan
// of the largest counts its parameters and bytes in 64 bits.
constexpr int64_t kMaxWidth = 65536, kMaxCount = 4096, kMaxImage = 16384, kMaxClasses = int64_t{1} << 24;

Config preset(const std::string& size) {
  Config c;  // tiny: 8x8 single-channel images in 2x2 patches (scikit-learn's digits), 10 classes
  c.mlp = 128;
  if (size == "vit-b16") {  // ViT-Base/16 (Dosovitskiy et al., table 1) on 224x224 RGB, ImageNet's classes
    c = Config{224, 16, 3, 1000, 768, 12, 12, 0, 3072};
  }
  if (size == "deepvit-8b") {
    // The FSDP blog's 8B DeepViT, as its authors' benchmark configures vit-pytorch's DeepViT
    // (lessw2020/transformer_framework, config/deepvit_config.py, model "8B"): 256x256 RGB in
    // 32x32 patches, width 1024, 952 blocks of 16 heads of 64, MLP 2048, 1000 classes, with
    // vit-pytorch's patch norms, no qkv bias and LayerNorm's default epsilon.
    c = Config{256, 32, 3, 1000, 1024, 952, 16, 64, 2048, true, true, false, 1e-5};
  }
  return c;
}

template <class T>
T hf_value(const json& j, const std::string& file, const char* key, std::optional<T> fallback = std::nullopt) {
  return fsdpx::hf::config_value<T>(j, file, key, "ViT", fallback);
}

Config config_from_hf(const json& j, const std::string& file) {
  const std::string type = hf_value<std::string>(j, file, "model_type", std::string());
  if (type != "vit")
    throw fsdpx::Error(file + ": model_type '" + type +
                       "' is not a ViT; --model.from_hf reads "
                       "ViTForImageClassification directories (model_type 'vit')");
  if (const std::string act = hf_value<std::string>(j, file, "hidden_act", std::string("gelu")); act != "gelu")
    throw fsdpx::Error(file + ": hidden_act '" + act + "' is not implemented (vit's MLP uses the exact GELU: 'gelu')");
  Config c;
  c.dim = hf_value<int64_t>(j, file, "hidden_size");
  c.layers = hf_value<int64_t>(j, file, "num_hidden_layers");
  c.heads = hf_value<int64_t>(j, file, "num_attention_heads");
  c.mlp = hf_value<int64_t>(j, file, "intermediate_size");
  c.image = hf_value<int64_t>(j, file, "image_size", int64_t{224});
  c.patch = hf_value<int64_t>(j, file, "patch_size", int64_t{16});
  c.channels = hf_value<int64_t>(j, file, "num_channels", int64_t{3});
  c.norm_eps = hf_value<double>(j, file, "layer_norm_eps", 1e-12);
  c.qkv_bias = hf_value<bool>(j, file, "qkv_bias", true);
  // transformers writes the classes as id2label; num_labels where a writer gave it alone.
  if (j.contains("id2label") && j["id2label"].is_object() && !j["id2label"].empty())
    c.classes = static_cast<int64_t>(j["id2label"].size());
  else c.classes = hf_value<int64_t>(j, file, "num_labels", int64_t{2});
  if (c.heads > 0) c.head_dim = c.dim / c.heads;
  return c;
}

void check_config(Config& c) {
  if (c.head_dim == 0) {
    if (c.dim % c.heads != 0)
      throw fsdpx::Error("dim " + std::to_string(c.dim) + " does not split into " + std::to_string(c.heads) +
                         " heads; give --model.head_dim, or a dim that heads divides");
    c.head_dim = c.dim / c.heads;
  }
  if (c.mlp == 0) c.mlp = 4 * c.dim;
  if (c.image % c.patch != 0)
    throw fsdpx::Error("image " + std::to_string(c.image) + " is not a whole number of patches of " +
                       std::to_string(c.patch) + "; give a --model.patch that divides --model.image");
  if (c.norm_eps <= 0) throw fsdpx::Error("norm_eps must be positive, got " + std::to_string(c.norm_eps));
}

// fsdpx's block parameter names and Hugging Face ViT's, one to one.
const std::vector<std::pair<std::string, std::string>>& block_names() {
  static const std::vector<std::pair<std::string, std::string>> names{
      {"attention_norm.weight", "layernorm_before.weight"},
      {"attention_norm.bias", "layernorm_before.bias"},
      {"attention.wq", "attention.attention.query.weight"},
      {"attention.bq", "attention.attention.query.bias"},
      {"attention.wk", "attention.attention.key.weight"},
      {"attention.bk", "attention.attention.key.bias"},
      {"attention.wv", "attention.attention.value.weight"},
      {"attention.bv", "attention.attention.value.bias"},
      {"attention.wo", "attention.output.dense.weight"},
      {"attention.bo", "attention.output.dense.bias"},
      {"mlp_norm.weight", "layernorm_after.weight"},
      {"mlp_norm.bias", "layernorm_after.bias"},
      {"mlp.w1", "intermediate.dense.weight"},
      {"mlp.b1", "intermediate.dense.bias"},
      {"mlp.w2", "output.dense.weight"},
      {"mlp.b2", "output.dense.bias"}};
  return names;
}

}  // namespace

std::vector<fsdpx::OptionSpec> options() {
  return {
      fsdpx::choice_option("size", "tiny", {"tiny", "vit-b16", "deepvit-8b"},
                           "preset: tiny (8x8x1 images, 64x2, for scikit-learn's digits), vit-b16 (ViT-Base/16, "
                           "224x224x3), deepvit-8b (the FSDP blog's 8B DeepViT: 1024x952, re-attention)"),
      fsdpx::string_option("from_hf", "",
                           "a Hugging Face ViTForImageClassification directory: configuration from its config.json, "
                           "initial weights from its safetensors"),
      fsdpx::int_option("image", 0, {0, kMaxImage}, "image height and width in pixels (0: the preset's)"),
      fsdpx::int_option("patch", 0, {0, kMaxImage}, "patch height and width, dividing image (0: the preset's)"),
      fsdpx::int_option("channels", 0, {0, 64}, "image channels (0: the preset's)"),
      fsdpx::int_option("classes", 0, {0, kMaxClasses}, "output classes (0: the preset's)"),
      fsdpx::int_option("dim", 0, {0, kMaxWidth}, "model width (0: the preset's)"),
      fsdpx::int_option("layers", 0, {0, kMaxCount}, "transformer blocks (0: the preset's)"),
      fsdpx::int_option("heads", 0, {0, kMaxCount}, "attention heads (0: the preset's)"),
      fsdpx::int_option("head_dim", 0, {0, kMaxWidth}, "width of a head (0: the preset's, or dim / heads)"),
      fsdpx::int_option("mlp", 0, {0, kMaxWidth * 8}, "MLP hidden size (0: the preset's, or 4 x dim)"),
      fsdpx::flag_option("reattention", false, "DeepViT's re-attention (the preset's unless given)"),
      fsdpx::flag_option("patch_norms", false,
                         "vit-pytorch's LayerNorms before and after the patch projection (the preset's unless given)"),
      fsdpx::flag_option("qkv_bias", true,
                         "biases on the query, key and value projections (the preset's unless given)"),
      fsdpx::float_option("norm_eps", 0, fsdpx::FloatRange::closed(0, 1),
                          "LayerNorm epsilon (0: the preset's: 1e-12 as Hugging Face's ViT, 1e-5 for deepvit-8b)")};
}

Config config_of(const fsdpx::Options& o, json* hf_source) {
  const std::string hf = o.get_string("from_hf");
  if (!hf.empty() && o.was_given("size"))
    throw fsdpx::Error("--model.size conflicts with --model.from_hf: the configuration comes from " + hf +
                       "/config.json; drop --model.size");
  Config c = preset(o.get_string("size"));
  if (!hf.empty()) {
    *hf_source = fsdpx::hf::read_config(hf);
    c = config_from_hf(*hf_source, (std::filesystem::path(hf) / "config.json").string());
  }
  auto conflict = [&](const std::string& name) {
    return fsdpx::Error("--model." + name + " conflicts with --model.from_hf: the configuration comes from " + hf +
                        "/config.json");
  };
  for (auto [name, field] : {std::pair<const char*, int64_t*>{"image", &c.image},
                             {"patch", &c.patch},
                             {"channels", &c.channels},
                             {"classes", &c.classes},
                             {"dim", &c.dim},
                             {"layers", &c.layers},
                             {"heads", &c.heads},
                             {"head_dim", &c.head_dim},
                             {"mlp", &c.mlp}}) {
    const int64_t v = o.get_int(name);  // within its declared range
    if (v > 0 && !hf.empty()) throw conflict(name);
    if (v > 0) *field = v;
  }
  // A width or head count given without head_dim: the heads split the width given.
  if (o.get_int("head_dim") == 0 && (o.get_int("dim") > 0 || o.get_int("heads") > 0)) c.head_dim = 0;
  for (auto [name, field] : {std::pair<const char*, bool*>{"reattention", &c.reattention},
                             {"patch_norms", &c.patch_norms},
                             {"qkv_bias", &c.qkv_bias}}) {
    const bool v = o.get_bool(name);  // read whether given or not: the preset's value stands when not
    if (!o.was_given(name)) continue;
    if (!hf.empty() && v != *field) throw conflict(name);
    *field = v;
  }
  if (o.get_float("norm_eps") > 0) {
    if (!hf.empty()) throw conflict("norm_eps");
    c.norm_eps = o.get_float("norm_eps");
  }
  check_config(c);
  return c;
}

std::string hf_name_of(const std::string& name) {
  static const std::map<std::string, std::string> top{
      {"embeddings.proj.weight", "vit.embeddings.patch_embeddings.projection.weight"},
      {"embeddings.proj.bias", "vit.embeddings.patch_embeddings.projection.bias"},
      {"embeddings.cls_token", "vit.embeddings.cls_token"},
      {"embeddings.pos_embedding", "vit.embeddings.position_embeddings"},
      {"norm.weight", "vit.layernorm.weight"},
      {"norm.bias", "vit.layernorm.bias"},
      {"head.weight", "classifier.weight"},
      {"head.bias", "classifier.bias"}};
  if (auto it = top.find(name); it != top.end()) return it->second;
  static const std::regex block(R"(blocks\.([0-9]+)\.(.+))");
  std::smatch m;
  if (std::regex_match(name, m, block))
    for (const auto& [mine, theirs] : block_names())
      if (m[2] == mine) return "vit.encoder.layer." + m[1].str() + "." + theirs;
  throw fsdpx::Error("vit has no Hugging Face name for parameter '" + name +
                     "' (Hugging Face's ViT has no re-attention and no patch norms)");
}

std::string hf_config_json(const Config& c, const json& source) {
  json j = source.is_object() ? source : json::object();
  if (!source.is_object()) {
    j["architectures"] = {"ViTForImageClassification"};
    j["model_type"] = "vit";
    j["hidden_act"] = "gelu";
    j["hidden_dropout_prob"] = 0.0;
    j["attention_probs_dropout_prob"] = 0.0;
    j["initializer_range"] = 0.02;
    json labels = json::object();
    for (int64_t i = 0; i < c.classes; ++i) labels[std::to_string(i)] = "LABEL_" + std::to_string(i);
    j["id2label"] = labels;
  }
  j["hidden_size"] = c.dim;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["intermediate_size"] = c.mlp;
  j["image_size"] = c.image;
  j["patch_size"] = c.patch;
  j["num_channels"] = c.channels;
  j["layer_norm_eps"] = c.norm_eps;
  j["qkv_bias"] = c.qkv_bias;
  return j.dump(2);
}

}  // namespace vit
