#include "torch_optimizer_state.h"

#include <memory>

#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/dtype_name.h"

namespace fsdpx {

namespace {

void* key_of(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

template <typename State>
State* state_of(torch::optim::Optimizer& o, const at::Tensor& param) {
  auto it = o.state().find(key_of(param));
  return it == o.state().end() ? nullptr : static_cast<State*>(it->second.get());
}

template <typename State>
State& made_state(torch::optim::Optimizer& o, const at::Tensor& param) {
  auto& slot = o.state()[key_of(param)];
  if (!slot) slot = std::make_unique<State>();
  return static_cast<State&>(*slot);
}

// Adam's and AdamW's state, which have the same fields: its tensors (zeros before the first
// step), or their values taken from `in`.
template <typename State, typename Options>
ShardState adam_state(torch::optim::Optimizer& o, const at::Tensor& param, int group) {
  const State* s = state_of<State>(o, param);
  const bool ams = static_cast<const Options&>(o.param_groups()[group].options()).amsgrad();
  auto get = [&](const at::Tensor& t) { return s && t.defined() ? t : at::zeros_like(param); };
  ShardState out{{"exp_avg", get(s ? s->exp_avg() : at::Tensor())},
                 {"exp_avg_sq", get(s ? s->exp_avg_sq() : at::Tensor())},
                 {"step", at::scalar_tensor(s ? static_cast<double>(s->step()) : 0.0, at::kDouble)}};
  if (ams) out.emplace_back("max_exp_avg_sq", get(s ? s->max_exp_avg_sq() : at::Tensor()));
  return out;
}

template <typename State>
void load_adam(torch::optim::Optimizer& o, const at::Tensor& param, const std::string& key, const at::Tensor& rows) {
  State& s = made_state<State>(o, param);
  auto take = [&](const at::Tensor& t) { return t.defined() ? t : at::zeros_like(param); };
  if (key == "step") {
    s.step(static_cast<int64_t>(rows.item<double>()));
  } else if (key == "exp_avg") {
    s.exp_avg(take(s.exp_avg()));
    s.exp_avg().copy_(rows);
  } else if (key == "exp_avg_sq") {
    s.exp_avg_sq(take(s.exp_avg_sq()));
    s.exp_avg_sq().copy_(rows);
  } else if (key == "max_exp_avg_sq") {
    s.max_exp_avg_sq(take(s.max_exp_avg_sq()));
    s.max_exp_avg_sq().copy_(rows);
  } else {
    throw Error("checkpoint: torch::optim's Adam has no state '" + key + "'");
  }
}

}  // namespace

TorchOptimizerState::TorchOptimizerState(torch::optim::Optimizer& optimizer, torch::nn::Module& module,
                                         const ShardingEngine& engine)
    : optimizer_(optimizer) {
  if (dynamic_cast<torch::optim::SGD*>(&optimizer)) kind_ = Kind::Sgd, kind_name_ = "SGD";
  else if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) kind_ = Kind::AdamW, kind_name_ = "AdamW";
  else if (dynamic_cast<torch::optim::Adam*>(&optimizer)) kind_ = Kind::Adam, kind_name_ = "Adam";
  else
    throw Error("checkpoint: fsdpx saves the state of torch::optim's SGD, Adam and AdamW (as the sgd and adamw "
                "plugins'), not of this optimizer; save with one of those, or with an optimizer plugin "
                "(ShardedModule::optimizer)");
  std::map<void*, int> group_of;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    for (const at::Tensor& t : groups[g].params()) group_of[key_of(t)] = static_cast<int>(g);
  const auto named = module.named_parameters();
  for (const ParamShard& s : engine.shards()) {
    const at::Tensor* t = named.find(s.name);
    if (!t) continue;
    Param p{*t, s.param.dim() ? s.param.size(0) : 1, -1};
    if (auto it = group_of.find(key_of(*t)); it != group_of.end()) p.group = it->second;
    params_[s.name] = p;
  }
}

void TorchOptimizerState::step(double) {
  throw Error("a torch::optim optimizer steps itself (optimizer.step()); this view of it serves checkpoints only");
}

double TorchOptimizerState::base_lr() const { return optimizer_.param_groups().at(0).options().get_lr(); }

const TorchOptimizerState::Param* TorchOptimizerState::find(const std::string& name) const {
  auto it = params_.find(name);
  return it == params_.end() || it->second.group < 0 ? nullptr : &it->second;
}

at::Tensor TorchOptimizerState::padded(const Param& p, const at::Tensor& rows) const {
  if (rows.sizes() != p.tensor.sizes())
    throw Error("checkpoint: torch::optim " + kind_name_ + "'s state of a parameter has shape " +
                shape_text(rows.sizes().vec()) + " where the parameter, this rank's shard, has " +
                shape_text(p.tensor.sizes().vec()) + ": the optimizer stepped the whole parameter before "
                "fully_shard made it a shard; build the optimizer after fully_shard");
  if (p.tensor.dim() == 0) return rows;
  std::vector<int64_t> shape = rows.sizes().vec();
  shape[0] = p.padded_rows;
  at::Tensor out = at::zeros(shape, rows.options());
  out.narrow(0, 0, rows.size(0)).copy_(rows);
  return out;
}

ShardState TorchOptimizerState::state(const std::string& name) const {
  const Param* p = find(name);
  if (!p) return {};  // a parameter the optimizer does not step: no state
  at::NoGradGuard no_grad;
  ShardState st;
  if (kind_ == Kind::Sgd) {
    const auto& opts = static_cast<const torch::optim::SGDOptions&>(optimizer_.param_groups()[p->group].options());
    if (opts.momentum() == 0) return {};
    const auto* s = state_of<torch::optim::SGDParamState>(optimizer_, p->tensor);
    const bool initialised = s && s->momentum_buffer().defined();
    st = {{"momentum_buffer", initialised ? s->momentum_buffer() : at::zeros_like(p->tensor)},
          {"initialised", at::scalar_tensor(initialised ? 1.0 : 0.0, at::kDouble)}};
  } else if (kind_ == Kind::AdamW) {
    st = adam_state<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(optimizer_, p->tensor, p->group);
  } else {
    st = adam_state<torch::optim::AdamParamState, torch::optim::AdamOptions>(optimizer_, p->tensor, p->group);
  }
  for (auto& [key, t] : st)
    if (t.dim() > 0) t = padded(*p, t);
  return st;
}

void TorchOptimizerState::load_state(const std::string& name, const ShardState& st) {
  const Param* p = find(name);
  if (!p) throw Error("checkpoint: torch::optim " + kind_name_ + " does not step parameter '" + name + "'");
  at::NoGradGuard no_grad;
  bool initialised = true;
  for (const auto& [key, t] : st)
    if (key == "initialised") initialised = t.item<double>() != 0;
  for (const auto& [key, t] : st) {
    const at::Tensor rows = t.dim() > 0 && p->tensor.dim() > 0 ? t.narrow(0, 0, p->tensor.size(0)) : t;
    if (kind_ == Kind::Sgd) {
      if (key == "initialised") continue;
      if (key != "momentum_buffer") throw Error("checkpoint: torch::optim's SGD has no state '" + key + "'");
      // Not yet initialised: the first step takes the gradient as the buffer, as a fresh SGD does.
      if (initialised) made_state<torch::optim::SGDParamState>(optimizer_, p->tensor).momentum_buffer(rows.clone());
    } else if (kind_ == Kind::AdamW) {
      load_adam<torch::optim::AdamWParamState>(optimizer_, p->tensor, key, rows);
    } else {
      load_adam<torch::optim::AdamParamState>(optimizer_, p->tensor, key, rows);
    }
  }
}

}  // namespace fsdpx
