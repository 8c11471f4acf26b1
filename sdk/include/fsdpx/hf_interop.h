// fsdpx/hf_interop.h: an optional capability for models that have a Hugging Face transformers
// counterpart (gpt: LlamaForCausalLM, t5: T5ForConditionalGeneration, vit: ViTForImageClassification).
//
// A model offers it by inheriting the mix-in besides its interface, as with fsdpx/evaluation.h:
//
//   class Gpt final : public fsdpx::Model, public fsdpx::HuggingFaceModel { ... };
//
// The trainer asks with dynamic_cast: when hf_weights_dir() names a directory, the run's initial
// weights are read from it (each rank reads only its own rows), under the names hf_name() gives.
// fsdpx-ckpt export-hf writes a checkpoint back as that directory: config.json from hf_config_json()
// and the tensors under their Hugging Face names. Additive: plugins built without it load as before.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "fsdpx/export.h"

namespace fsdpx {

class FSDPX_API HuggingFaceModel {
 public:
  virtual ~HuggingFaceModel();
  // The Hugging Face directory (config.json, model.safetensors or model-*-of-*.safetensors with
  // model.safetensors.index.json) whose weights the run starts from; "" when it starts from its
  // own initialisation.
  virtual std::string hf_weights_dir() const = 0;
  // The Hugging Face name of parameter `name` ("layers.0.attention.wq" ->
  // "model.layers.0.self_attn.q_proj.weight").
  virtual std::string hf_name(const std::string& name) const = 0;
  // Whether a tensor of a Hugging Face checkpoint that maps to no parameter may be left unread
  // (e.g. an old checkpoint's rotary cache); any other such tensor is an error.
  virtual bool hf_ignorable(const std::string& /*tensor*/) const { return false; }
  // config.json for this model's configuration (model_type, sizes, rope, tied embeddings).
  // fsdpx::Error naming why for a configuration with no Hugging Face counterpart (vit with
  // re-attention): its checkpoints then record no config.json, and export-hf gives that error.
  virtual std::string hf_config_json() const = 0;
  // The fp32 logits of the model's inputs (token ids [B, T] -> [B, T, vocab]; vit's pixel values
  // [B, C, H, W] -> [B, classes]), to compare a conversion with transformers.
  // Runs the model's forward: inside the sharding engine's forward when sharded.
  virtual at::Tensor hf_logits(const at::Tensor& token_ids) = 0;
};

}  // namespace fsdpx
