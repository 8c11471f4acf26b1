// fsdpx/layer_work.h: a model's statement of the work each layer of its forward does (plugin ABI
// 1.x mix-in, found with dynamic_cast like ActivationMemory). The plan predicts a step's time from
// it (--dry-run, plan.json): each matmul at the rate this machine, or the --cluster file, achieves
// for its shape in the compute dtype, and the layer's other ops from the bytes they move, at
// memory bandwidth. A layer's backward is counted as twice its forward: two matmuls of one
// forward matmul's size (the input's gradient and the weight's), and its other ops' bytes twice
// (read the saved tensors and the gradient, write the input's gradient); its attention's and its
// other ops' backward as the model states them. A model without it is planned from
// flops_per_token, shared over the units by their parameters, at the square-matmul rate.
//
//   class Gpt final : public fsdpx::Model, public fsdpx::ActivationMemory, public fsdpx::LayerWork { ... };
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "fsdpx/export.h"

namespace fsdpx {

// `batch` products of an [m, k] matrix with a [k, n] one: 2 m k n flops each.
struct Matmul {
  int64_t m = 0, k = 0, n = 0;
  int64_t batch = 1;
  double flops() const { return 2.0 * static_cast<double>(batch * m) * static_cast<double>(k * n); }
};

// One at::scaled_dot_product_attention call: `batch` samples of `heads` heads of `seq` queries
// and keys of `head_dim` (keys and values repeated to every head).
struct Attention {
  int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  bool causal = true;
  double flops() const {  // forward: the scores and their product with the values
    return 4.0 * static_cast<double>(batch * heads) * static_cast<double>(seq * seq * head_dim) * (causal ? 0.5 : 1);
  }
};

// One layer's forward on one rank, and what its backward adds.
struct LayerOps {
  // As LayerActivations::path: the layer's module path, or a name of the model's own ("loss").
  std::string path;
  std::vector<Matmul> matmuls;
  std::vector<Attention> attention;
  // Its other ops (norms, activations, rotations, copies, softmax, ...): the bytes they read and
  // write, and how many kernels they run, in forward and in backward. Each kernel costs its launch
  // (and in backward its autograd node) besides its bytes.
  int64_t memory_bytes = 0, backward_memory_bytes = 0;
  int64_t kernels = 0, backward_kernels = 0;
};

class FSDPX_API LayerWork {
 public:
  virtual ~LayerWork();
  // The layers of one forward in the order they run, for `batch` samples of `seq` tokens (one
  // rank's micro-batch) computing in `compute`. Deterministic in its arguments.
  virtual std::vector<LayerOps> layer_ops(int64_t batch, int64_t seq, c10::ScalarType compute) const = 0;
};

}  // namespace fsdpx
