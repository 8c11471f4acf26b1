// Evaluator: the held-out loss (and accuracy) over every rank, when the model can evaluate
// (fsdpx::Evaluable) and the data has held-out samples (fsdpx::HeldOutData).
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/interfaces.h"

namespace fsdpx {

class Evaluator {
 public:
  // The references outlive the evaluator. `batch_size`: samples per rank of a training
  // micro-batch (a chunk of evaluation is four of them). `deterministic`: --deterministic.
  Evaluator(ShardingEngine& engine, Model& model, DataSource& data, Communicator& world, int64_t batch_size,
            bool deterministic);

  // {"step", "eval_loss", "eval_samples"[, "eval_accuracy"]} from the world's sums, or null when
  // the model or the data cannot evaluate. Collective: every rank runs the same forwards.
  nlohmann::json evaluate(int64_t step);

 private:
  // Each rank evaluates its share of the held-out samples in chunks; one all-reduce of the sums.
  nlohmann::json in_chunks(int64_t step);
  // --deterministic: one sample per forward, rank r taking samples r, r + W, ...; every rank's
  // sums gathered and added in sample order, so the figures have the same bits at every world size.
  nlohmann::json in_sample_order(int64_t step);

  ShardingEngine& engine_;
  Evaluable* evaluable_;
  HeldOutData* heldout_;
  Communicator& world_;
  int64_t batch_size_;
  bool deterministic_;
};

}  // namespace fsdpx
