// t5's configuration: presets, checks, and Hugging Face's config.json read and written.
#include <fsdpx/error.h>
#include <fsdpx/files.h>
#include <fsdpx/hf_config.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "t5.h"

namespace t5 {

using json = nlohmann::json;
namespace fs = std::filesystem;

Config preset(const std::string& size) {
  // {dim, head_dim, ffn_hidden, layers, decoder_layers, heads, vocab}: transformers' T5 configs
  // (google-t5/t5-small ... t5-11b); tiny is for tests, its vocabulary ByT5's 384.
  Config c;
  if (size == "tiny")
    c = Config{64, 16, 128, 2, 2, 4, 384};
  else if (size == "small")
    c = Config{512, 64, 2048, 6, 6, 8, 32128};
  else if (size == "base")
    c = Config{768, 64, 3072, 12, 12, 12, 32128};
  else if (size == "large")
    c = Config{1024, 64, 4096, 24, 24, 16, 32128};
  else if (size == "3b")
    c = Config{1024, 128, 16384, 24, 24, 32, 32128};
  else if (size == "11b")
    c = Config{1024, 128, 65536, 24, 24, 128, 32128};
  else
    throw fsdpx::Error("no t5 preset '" + size + "' (tiny, small, base, large, 3b, 11b)");
  return c;
}

void make_v1_1(Config& c) {
  c.gated = true;
  c.tie_embeddings = false;
  c.scale_logits = false;
}

void check_config(const Config& c) {
  for (auto [name, v] : {std::pair<const char*, int64_t>{"dim", c.dim},
                         {"head_dim", c.head_dim},
                         {"ffn_hidden", c.ffn_hidden},
                         {"layers", c.layers},
                         {"decoder_layers", c.decoder_layers},
                         {"heads", c.heads},
                         {"vocab", c.vocab}})
    if (v < 1) throw fsdpx::Error(std::string(name) + " is " + std::to_string(v) + "; t5 needs at least 1");
  // Each direction's exact half needs at least one bucket, and the log-spaced ones a distance beyond it.
  if (c.buckets < 4)
    throw fsdpx::Error("buckets is " + std::to_string(c.buckets) + "; T5's relative positions need at least 4");
  if (c.max_distance <= c.buckets / 4)
    throw fsdpx::Error("max_distance " + std::to_string(c.max_distance) + " must exceed buckets / 4 = " +
                       std::to_string(c.buckets / 4) + " (the exact distances of one direction)");
  if (!(c.norm_eps > 0)) throw fsdpx::Error("norm_eps must be positive");
}

// --- reading a Hugging Face directory ------------------------------------------------------------

namespace {

// The header of a safetensors file: its tensor names.
std::vector<std::string> safetensors_names(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  unsigned char len[8] = {};
  if (!in.read(reinterpret_cast<char*>(len), 8))
    throw fsdpx::Error(file.string() + " is not a safetensors file (no header)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > (uint64_t{1} << 27))
    throw fsdpx::Error(file.string() + ": a header of " + std::to_string(n) + " bytes is not safetensors");
  std::string header(static_cast<size_t>(n), '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(n)))
    throw fsdpx::Error(file.string() + " is truncated in its header");
  std::vector<std::string> names;
  try {
    const json j = json::parse(header);
    for (const auto& [key, value] : j.items())
      if (key != "__metadata__") names.push_back(key);
  } catch (const std::exception& e) {
    throw fsdpx::Error(file.string() + ": the header is not JSON (" + e.what() + ")");
  }
  return names;
}

// A key of config.json of the JSON type `T`; `fallback` when absent (nullopt: required).
template <class T>
T hf_value(const json& j, const std::string& file, const char* key, std::optional<T> fallback = std::nullopt) {
  return fsdpx::hf::config_value<T>(j, file, key, "T5", fallback);
}

// The architecture config.json names, for the message that refuses it.
std::string architecture_of(const json& j, const std::string& type) {
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    return j["architectures"][0].get<std::string>() + " (model_type '" + type + "')";
  return "model_type '" + type + "'";
}

void check_architecture(const json& j, const std::string& file) {
  const std::string type = hf_value<std::string>(j, file, "model_type", std::string());
  bool generation = !j.contains("architectures");
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"]) generation = generation || a == "T5ForConditionalGeneration";
  if (type != "t5" || !generation)
    throw fsdpx::Error(file + " describes a " + architecture_of(j, type) +
                       ", not a T5ForConditionalGeneration; "
                       "--model.name t5 reads T5 encoder-decoders (model_type 't5')");
}

void read_feed_forward(const json& j, const std::string& file, Config& c) {
  const std::string ff = hf_value<std::string>(j, file, "feed_forward_proj", std::string("relu"));
  if (ff != "relu" && ff != "gated-gelu")
    throw fsdpx::Error(file + ": feed_forward_proj '" + ff +
                       "' is not implemented; t5 has 'relu' (v1.0) and "
                       "'gated-gelu' (v1.1, flan)");
  c.gated = ff == "gated-gelu";
}

// Tied unless config.json says false or the weights hold an lm_head of their own (transformers 5
// writes tie_word_embeddings true for every T5, and scale_decoder_outputs for the scaling).
void read_head(const json& j, const std::string& file, const std::vector<std::string>& weights, Config& c) {
  const bool tie = hf_value<bool>(j, file, "tie_word_embeddings", true);
  const bool has_head = std::find(weights.begin(), weights.end(), "lm_head.weight") != weights.end();
  c.tie_embeddings = tie && !has_head;
  c.scale_logits = hf_value<bool>(j, file, "scale_decoder_outputs", tie);
  for (const char* key : {"pad_token_id", "decoder_start_token_id"})
    if (const int64_t id = hf_value<int64_t>(j, file, key, kPad); id != kPad)
      throw fsdpx::Error(file + ": " + key + " is " + std::to_string(id) +
                         "; t5 pads and starts the decoder with id 0, "
                         "as T5's and ByT5's vocabularies do");
}

}  // namespace

std::vector<std::string> hf_tensor_names(const std::string& dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json", single = fs::path(dir) / "model.safetensors";
  std::vector<std::string> names;
  if (fs::exists(index)) {
    std::ifstream in(index);
    try {
      const json j = json::parse(in);
      for (const auto& [key, value] : j.at("weight_map").items()) names.push_back(key);
    } catch (const std::exception& e) {
      throw fsdpx::Error(index.string() + ": not an index of safetensors shards (" + e.what() + ")");
    }
  } else if (fs::exists(single)) {
    fsdpx::check_input_file(single.string(), "--model.from_hf's");
    names = safetensors_names(single);
  }
  return names;  // none: the weights' loader names what is missing
}

Config config_from_hf(const json& j, const std::string& file, const std::vector<std::string>& weights) {
  check_architecture(j, file);
  Config c;
  c.dim = hf_value<int64_t>(j, file, "d_model");
  c.head_dim = hf_value<int64_t>(j, file, "d_kv");
  c.ffn_hidden = hf_value<int64_t>(j, file, "d_ff");
  c.layers = hf_value<int64_t>(j, file, "num_layers");
  c.decoder_layers = hf_value<int64_t>(j, file, "num_decoder_layers", c.layers);
  c.heads = hf_value<int64_t>(j, file, "num_heads");
  c.vocab = hf_value<int64_t>(j, file, "vocab_size");
  c.buckets = hf_value<int64_t>(j, file, "relative_attention_num_buckets", int64_t{32});
  c.max_distance = hf_value<int64_t>(j, file, "relative_attention_max_distance", int64_t{128});
  c.norm_eps = hf_value<double>(j, file, "layer_norm_epsilon", 1e-6);
  read_feed_forward(j, file, c);
  read_head(j, file, weights, c);
  check_config(c);
  return c;
}

std::string hf_config_json(const Config& c, const std::string& source) {
  json j = source.empty() ? json::object() : json::parse(source);
  if (source.empty()) {
    j["architectures"] = {"T5ForConditionalGeneration"};
    j["model_type"] = "t5";
    j["is_encoder_decoder"] = true;
    j["pad_token_id"] = kPad;
    j["eos_token_id"] = kEos;
    j["decoder_start_token_id"] = kPad;
    j["initializer_factor"] = 1.0;
    j["dropout_rate"] = 0.1;  // transformers' default; fsdpx trains without dropout
  }
  j["d_model"] = c.dim;
  j["d_kv"] = c.head_dim;
  j["d_ff"] = c.ffn_hidden;
  j["num_layers"] = c.layers;
  j["num_decoder_layers"] = c.decoder_layers;
  j["num_heads"] = c.heads;
  j["vocab_size"] = c.vocab;
  j["relative_attention_num_buckets"] = c.buckets;
  j["relative_attention_max_distance"] = c.max_distance;
  j["layer_norm_epsilon"] = c.norm_eps;
  j["feed_forward_proj"] = c.gated ? "gated-gelu" : "relu";
  j["dense_act_fn"] = c.gated ? "gelu_new" : "relu";
  j["is_gated_act"] = c.gated;
  // Both spellings: transformers 5 reads the scaling from scale_decoder_outputs, earlier ones
  // from tie_word_embeddings; an untied lm_head is written as its own tensor either way.
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["scale_decoder_outputs"] = c.scale_logits;
  return j.dump(2);
}

// --- names ---------------------------------------------------------------------------------------

namespace {

// A block's parameter (after "block.N.") to transformers' (after "block.N.layer."), for the
// encoder (sub-layers 0 self-attention, 1 feed-forward) and the decoder (0, 1 cross, 2).
std::string block_name(const std::string& rest, bool decoder) {
  const std::string ff = decoder ? "2" : "1";
  static const std::vector<std::pair<std::string, std::string>> prefixes{
      {"self_attention_norm.weight", "0.layer_norm.weight"},
      {"self_attention.", "0.SelfAttention."},
      {"cross_attention_norm.weight", "1.layer_norm.weight"},
      {"cross_attention.", "1.EncDecAttention."},
      {"ffn_norm.weight", "F.layer_norm.weight"},
      {"feed_forward.", "F.DenseReluDense."}};
  for (const auto& [mine, theirs] : prefixes) {
    if (rest.compare(0, mine.size(), mine) != 0) continue;
    std::string out = theirs;
    if (out[0] == 'F') out.replace(0, 1, ff);
    if (mine.back() == '.') out += rest.substr(mine.size()) + ".weight";
    return out;
  }
  return "";
}

}  // namespace

std::string hf_name_of(const std::string& name) {
  if (name == "shared") return "shared.weight";
  if (name == "lm_head") return "lm_head.weight";
  static const std::regex stack(R"((encoder|decoder)\.(.+))"), block(R"(block\.([0-9]+)\.(.+))");
  std::smatch m, b;
  if (std::regex_match(name, m, stack)) {
    const std::string s = m[1].str(), rest = m[2].str();
    if (rest == "relative_attention_bias") return s + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight";
    if (rest == "final_layer_norm.weight") return s + ".final_layer_norm.weight";
    if (std::regex_match(rest, b, block)) {
      const std::string mapped = block_name(b[2].str(), s == "decoder");
      if (!mapped.empty()) return s + ".block." + b[1].str() + ".layer." + mapped;
    }
  }
  throw fsdpx::Error("t5 has no Hugging Face name for parameter '" + name + "'");
}

}  // namespace t5
