// Unit: one sharding unit's lifecycle around its forward and backward (FSDP2's FSDPState hooks
// with its FSDPParamGroup). The engine installs it as the UnitHooks of its module (fsdpx/unit.h).
//
//   pre_forward   unshard (wait for the gather), prefetch the next units, wrap the inputs in
//                 PostBackward so that post_backward runs once the unit's backward is done
//   run           the forward, or (activation checkpointing) the Recompute function
//   post_forward  reshard (if the layout says so), cast the root's output, hook the output's
//                 gradient to run pre_backward
//   pre_backward  unshard again
//   progress      once half of the unit's gradient bytes have arrived (a hook on each of its
//                 parameters counts them): wait for the previous unit's reduction, which
//                 overlapped the first half of this unit's backward, then prefetch the next
//                 units, which overlap the second half. A reduction in flight and a prefetched
//                 unit never coexist: the backward's working set is the same at every depth.
//   post_backward progress if the hooks did not; reshard, then issue this unit's reduction
//                 (when syncing)
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>

#include "fsdpx/unit.h"
#include "activation_offload.h"
#include "param_group.h"
#include "step_context.h"

namespace fsdpx {

struct Unit final : UnitHooks {
  StepContext* step = nullptr;  // its engine, as far as a unit needs it
  int64_t index = 0;  // in its engine's units (live_unit finds it by engine id and index)
  std::string fqn;    // "" for the root
  const torch::nn::Module* module = nullptr;
  bool root = false;
  bool checkpoint = false;  // recompute activations in backward instead of storing them
  bool float8 = false;      // its linear layers compute in float8 (EngineOptions::unit_float8)
  ParamGroup group;

  // Activation checkpointing: this step's forward and what it needs to run again.
  std::function<at::Tensor(const std::vector<at::Tensor>&)> recompute;
  uint64_t recompute_generation = 0;
  std::vector<int64_t> recompute_slots;  // which of the forward's tensor arguments were defined
  size_t recompute_arity = 0;            // how many tensor arguments it has
  at::Tensor recompute_rng;              // the device generator's state when the forward ran
  // Activation offload (EngineOptions::activation_offload_units): whether this unit's inputs move
  // to host memory, and this step's.
  bool offload = false;
  OffloadedInputs offloaded;

  int forward_calls = 0;
  // Where the unit is in this step's backward.
  enum class BackwardStage { Waiting, Computing, Progressed, Done } stage = BackwardStage::Waiting;
  int64_t grad_elements_seen = 0;  // this backward's parameter gradients so far (their hooks)
  int64_t progress_elements = 0;   // progress once this many have arrived: half the unit's

  std::vector<at::Tensor> pre_forward(std::vector<at::Tensor> inputs) override;
  at::Tensor post_forward(at::Tensor output) override;
  at::Tensor run(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                 const std::vector<at::Tensor>& inputs) override;
  bool recomputes() const override;

  void pre_backward(uint64_t generation);
  // A gradient of `elements` for one of the unit's parameters was computed.
  void on_parameter_gradient(int64_t elements);
  void progress();
  void post_backward(uint64_t generation);  // checks the generation first
  void post_backward();
  // A new forward: the step's flags and recompute state cleared.
  void begin_step();
  // The forward's tensor arguments from the defined ones (undefined where they were).
  std::vector<at::Tensor> arguments(const std::vector<at::Tensor>& defined) const;
  void drop_recompute();
};

// What the engine's autograd functions keep of their unit (engine id, index, name, generation)
// and how they find it again: saved_unit throws fsdpx::Error naming the unit if its engine is
// gone (see live_unit).
void save_unit(torch::autograd::AutogradContext* ctx, const Unit& u);
Unit& saved_unit(torch::autograd::AutogradContext* ctx);
uint64_t saved_generation(torch::autograd::AutogradContext* ctx);

}  // namespace fsdpx
