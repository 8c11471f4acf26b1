// fsdpx/model.h: a model to train, and the batches it consumes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "fsdpx/component.h"
#include "fsdpx/export.h"

namespace fsdpx {

// One rank's share of a step's global batch.
struct Batch {
  at::Tensor inputs;   // e.g. token ids [B, T] or features [B, F]
  at::Tensor targets;  // e.g. next tokens [B, T] or labels [B]
  int64_t samples = 0;
  int64_t tokens = 0;  // for throughput; equals samples for non-sequence models
};

// A parameter to be materialised later: an fp32 CPU tensor of `shape` with no memory behind it.
// Models create their parameters this way (register_parameter("w", deferred_tensor({n, m})));
// the sharding engine then gives each one memory, one at a time, and fills it through
// Model::init_parameter. Reading it before that is an error.
FSDPX_API at::Tensor deferred_tensor(at::IntArrayRef shape);

// The language-modelling batch of `sequences` [B, T+1] token ids: inputs are the first T
// tokens, targets the last T (each position's next token).
FSDPX_API Batch next_token_batch(const at::Tensor& sequences);

class FSDPX_API Model {
 public:
  static constexpr Kind kKind = Kind::Model;
  virtual ~Model();

  // The module tree, built by the factory. The engine shards it in place.
  virtual std::shared_ptr<torch::nn::Module> module() = 0;

  // Fills `param`, the full (unsharded) tensor of parameter `name`, with its initial value drawn
  // from `generator`. The engine seeds the generator from (seed, name) and calls this one unit
  // at a time, so the result must depend on nothing else: not the rank, not the world size.
  virtual void init_parameter(const std::string& name, at::Tensor& param,
                              at::Generator& generator) const = 0;

  // Forward pass and the mean loss over the batch's samples.
  virtual at::Tensor loss(const Batch& batch) = 0;

  // Class names of the layers a layer_type wrap policy may make units, e.g. {"Block"}; the first
  // is the model's repeated block, the one fsdpx-train --plan-search makes units of.
  virtual std::vector<std::string> layer_types() const = 0;

  // Training FLOPs per token (6N for a decoder), 0 if unknown. For throughput reports.
  virtual double flops_per_token() const { return 0.0; }
};

}  // namespace fsdpx
