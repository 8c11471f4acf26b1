// fsdpx/evaluation.h: optional capabilities for held-out evaluation (plugin ABI 1.1).
//
// A model or data source offers them by inheriting the mix-in besides its interface:
//
//   class Mlp final : public fsdpx::Model, public fsdpx::Evaluable { ... };
//   class Csv final : public fsdpx::DataSource, public fsdpx::HeldOutData { ... };
//
// The trainer asks with dynamic_cast; the interfaces of ABI 1.0 are unchanged, so plugins built
// against 1.0 load as before and are simply not evaluated.
#pragma once

#include <cstdint>

#include "fsdpx/export.h"
#include "fsdpx/model.h"

namespace fsdpx {

// Sums over a batch, so that ranks and chunks add up exactly.
struct EvalSums {
  double loss_sum = 0;   // the loss summed over the batch's samples
  double correct = -1;   // samples classified correctly; negative when the model has no classes
  int64_t samples = 0;
};

class FSDPX_API Evaluable {
 public:
  virtual ~Evaluable();
  // Forward only (the trainer runs it without gradients, inside the sharding engine's forward).
  virtual EvalSums evaluate(const Batch& batch) = 0;
};

class FSDPX_API HeldOutData {
 public:
  virtual ~HeldOutData();
  // Samples set aside from training, the same at every world size and seed.
  virtual int64_t num_heldout() const = 0;
  // Held-out samples [first, first + count) as one batch.
  virtual Batch heldout(int64_t first, int64_t count) = 0;
};

}  // namespace fsdpx
