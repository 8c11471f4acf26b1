// A torch::optim optimizer over a sharded module's parameters, seen by checkpoints as an
// fsdpx::Optimizer: each parameter's state under the keys the plugins of the same algorithm use
// (SGD: momentum_buffer, initialised; Adam and AdamW: exp_avg, exp_avg_sq, step, and
// max_exp_avg_sq with amsgrad), so that a checkpoint moves between torch::optim and the sgd or
// adamw plugin. The state is this rank's rows, as the parameters are; checkpoints want a shard's
// rows with its padding, so state() pads copies and load_state() takes the rows back.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/optimizer.h"

namespace torch::optim {
class Optimizer;
}
namespace torch::nn {
class Module;
}

namespace fsdpx {

class TorchOptimizerState final : public Optimizer {
 public:
  // `module`'s parameters are `engine`'s shards (fully_shard); `optimizer` steps some or all of
  // them. Throws fsdpx::Error for an optimizer whose state has no checkpoint form here (SGD, Adam
  // and AdamW have one).
  TorchOptimizerState(torch::optim::Optimizer& optimizer, torch::nn::Module& module, const ShardingEngine& engine);

  void init(std::vector<ParamShard>) override {}
  void step(double lr) override;  // throws: torch::optim steps itself
  double base_lr() const override;
  ShardState state(const std::string& param_name) const override;
  void load_state(const std::string& param_name, const ShardState& state) override;

 private:
  enum class Kind { Sgd, Adam, AdamW };
  struct Param {
    at::Tensor tensor;         // the module's parameter: this rank's rows
    int64_t padded_rows = 0;   // the shard's rows with its padding
    int group = -1;            // its param group in the optimizer; -1: the optimizer has it not
  };
  const Param* find(const std::string& name) const;
  at::Tensor padded(const Param& p, const at::Tensor& rows) const;

  torch::optim::Optimizer& optimizer_;
  Kind kind_;
  std::string kind_name_;
  std::map<std::string, Param> params_;
};

}  // namespace fsdpx
