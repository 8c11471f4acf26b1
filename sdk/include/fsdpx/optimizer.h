// fsdpx/optimizer.h: the update rule, applied to the local shards only.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdpx/component.h"
#include "fsdpx/export.h"
#include "fsdpx/options.h"

namespace fsdpx {

// A parameter shard as the optimizer sees it: an ordinary leaf tensor, updated in place, whose
// .grad() is this rank's reduced gradient shard (zeros where no rank produced a gradient;
// undefined for a frozen parameter, which keeps requires_grad() false). The gradient's dtype is
// the precision policy's gradient dtype, which may be lower than the parameter's (bf16_mixed's
// keep_low_precision_grads: bf16 gradients of fp32 shards): widen it where a kernel needs both
// alike. Modify the gradient in
// place only: the engine writes the next step's gradient into the same memory.
struct ParamShard {
  std::string name;  // fully-qualified parameter name, e.g. "blocks.0.attn.wq.weight"
  at::Tensor param;
};

// Named state tensors of one parameter shard, e.g. {"exp_avg", t}, {"exp_avg_sq", t}. Tensors
// whose dim 0 matches the shard's are sharded with it; others (a step count) are replicated.
using ShardState = std::vector<std::pair<std::string, at::Tensor>>;

// The list option "betas" of an Adam-style optimizer as two numbers in [0, 1); throws
// fsdpx::Error naming the bad value otherwise.
FSDPX_API std::pair<double, double> adam_betas(const Options& options);

// For Optimizer::step_shards: throws fsdpx::Error naming `optimizer` when [first, first + count)
// is not a range of the `size` shards init() took.
FSDPX_API void check_shard_range(const std::string& optimizer, size_t first, size_t count, size_t size);

class FSDPX_API Optimizer {
 public:
  static constexpr Kind kKind = Kind::Optimizer;
  virtual ~Optimizer();

  // Takes the shards this rank updates. Called once, before the first step (and before any
  // load_state).
  virtual void init(std::vector<ParamShard> params) = 0;
  // One update of every shard from its gradient, at learning rate `lr` (the trainer owns the
  // schedule; base_lr() is its peak).
  virtual void step(double lr) = 0;
  virtual double base_lr() const = 0;

  // The state of one shard (for checkpoints), and its restoration from such a state.
  //
  // state() may return the optimizer's own tensors, not copies: a save reads them as they are
  // (nothing writes them meanwhile), and the host reads their sizes to count the state's bytes.
  // It is called after init(), for every trainable shard, and must then already return every
  // key with its final shape (zeros before the first step): a resume learns from it what to read.
  //
  // On resume the host calls, after init() and before the first step, state() for each shard,
  // fills copies of those tensors from the checkpoint, and hands them back through load_state(),
  // once per shard whose state the checkpoint holds, with the same keys. load_state must take the values (copy them, or
  // keep the tensors it is given); it throws fsdpx::Error for a key or shape it cannot take.
  virtual ShardState state(const std::string& param_name) const = 0;
  virtual void load_state(const std::string& param_name, const ShardState& state) = 0;

  // ABI 1.2, for the optimizer step inside backward (--optimizer-in-backward): one update of the
  // shards [first, first + count) of the vector init() took, at learning rate `lr`, exactly as
  // step() updates them. The engine calls it for each unit's shards (a contiguous range) as soon
  // as their gradients are reduced, each shard once per step, and then frees those gradients, so
  // no rank holds every gradient shard at once. An optimizer that answers true to
  // can_step_shards() implements it; the defaults say no, and step_shards then throws
  // fsdpx::Error. The host calls neither on a plugin built against ABI 1.0 or 1.1.
  virtual bool can_step_shards() const;
  virtual void step_shards(double lr, size_t first, size_t count);
};

}  // namespace fsdpx
