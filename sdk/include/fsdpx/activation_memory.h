// fsdpx/activation_memory.h: a model's statement of the activation memory of its forward and
// backward (plugin ABI 1.x mix-in, found with dynamic_cast like the evaluation ones). The plan
// adds it to the engine's own working set to predict a step's peak per rank (--dry-run,
// plan.json), and refuses a run that cannot fit before any worker starts. A model without it is
// planned without activations, and the plan says so.
//
//   class Gpt final : public fsdpx::Model, public fsdpx::ActivationMemory { ... };
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "fsdpx/export.h"

namespace fsdpx {

// What one layer of the model holds in one forward and backward, in bytes on one rank.
struct LayerActivations {
  // The layer's module path, e.g. "layers.3.feed_forward", or a name of the model's own for code
  // outside any module (e.g. "loss"). The unit whose path prefixes it holds the layer (else the root);
  // the parameters whose names it prefixes (or equals) get their gradients in its backward.
  std::string path;
  int64_t saved = 0;  // kept by its forward for its backward (freed as its backward runs)
  int64_t input = 0;  // its input: what a unit that recomputes keeps of its first layer instead
  // Alive besides `saved` at the worst moment of its forward, freed by its end (e.g. the logits
  // while the loss is taken).
  int64_t forward_extra = 0;
  // Alive at the worst moment of its backward beyond what the layers before it saved: its own
  // saved bytes, gradients of activations and temporaries. Parameter gradients are left out:
  // the engine counts those.
  int64_t backward_peak = 0;
};

class FSDPX_API ActivationMemory {
 public:
  virtual ~ActivationMemory();
  // The layers of one forward in the order they run, for `batch` samples of `seq` tokens (one
  // rank's micro-batch) computing in `compute`. Deterministic in its arguments.
  virtual std::vector<LayerActivations> activations(int64_t batch, int64_t seq, c10::ScalarType compute) const = 0;
};

}  // namespace fsdpx
