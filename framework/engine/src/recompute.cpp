#include "recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "activation_offload.h"
#include "engine_state.h"
#include "fsdpx/error.h"

namespace fsdpx {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Runs the unit's forward again with a graph, the device's generator as it was in the first
// forward (the same dropout masks).
at::Tensor replay(Unit& u, const std::vector<at::Tensor>& defined) {
  const DeviceRuntime& device = *u.step->engine_config().device;
  const at::Tensor now = device.rng_state();
  device.set_rng_state(u.recompute_rng);
  at::AutoGradMode enable(true);
  at::Tensor out;
  try {
    out = u.recompute(u.arguments(defined));
  } catch (...) {
    device.set_rng_state(now);
    throw;
  }
  device.set_rng_state(now);
  return out;
}

// Which of the unit's defined inputs go to host memory (activation offload, on a device).
std::vector<bool> inputs_to_move(const Unit& u, const std::vector<at::Tensor>& defined) {
  std::vector<bool> moves(defined.size(), false);
  if (!u.offload || u.step->engine_config().device->is_cpu()) return moves;
  for (size_t i = 0; i < defined.size() && i < u.recompute_slots.size(); ++i)
    moves[i] = moves_to_host(defined[i], u.recompute_slots[i]);
  return moves;
}

// Activation offload, after the unit's forward: the previous offloaded unit's sources go once
// their copies are done, and this unit's inputs that move are copied to host memory. One that the
// forward changed in place is refused (its copy would not be the input).
void offload_after_forward(Unit& u, const std::vector<at::Tensor>& defined, const std::vector<bool>& moves,
                           const std::vector<int64_t>& versions) {
  std::vector<at::Tensor> moving;
  for (size_t i = 0; i < defined.size(); ++i) {
    if (!moves[i]) continue;
    if (defined[i]._version() != versions[i])
      throw Error("unit '" + u.fqn + "' changed its input " + std::to_string(u.recompute_slots[i]) + " in place "
                  "during its forward, and activation offload copies the input after the forward; leave the input "
                  "as it is, or take the unit out of the offloaded ones");
    moving.push_back(defined[i]);
  }
  if (moving.empty()) return;
  u.step->release_offloading();  // the previous unit's copies are done: its sources may go
  offload_inputs(*u.step->engine_config().device, defined, moves, u.offloaded);
  u.step->offload_issued(std::move(moving));
}

struct Recompute : public torch::autograd::Function<Recompute> {
  // `all` = the defined tensor arguments (Unit::recompute_slots says where they go), then the
  // unit's parameters.
  static at::Tensor forward(AutogradContext* ctx, Unit* u, int64_t num_inputs, at::TensorList all) {
    save_unit(ctx, *u);
    ctx->saved_data["num_inputs"] = num_inputs;
    std::vector<at::Tensor> defined(all.begin(), all.begin() + num_inputs);
    c10::List<bool> needs;
    for (const auto& t : defined) needs.push_back(t.requires_grad());
    ctx->saved_data["needs"] = needs;
    u->recompute_rng = u->step->engine_config().device->rng_state();
    // Saved before the forward, so that autograd sees a change in place; an input that moves to
    // host memory leaves an undefined tensor in its place.
    const std::vector<bool> moves = inputs_to_move(*u, defined);
    std::vector<at::Tensor> kept;
    std::vector<int64_t> versions;
    for (size_t i = 0; i < defined.size(); ++i) {
      kept.push_back(moves[i] ? at::Tensor() : defined[i]);
      versions.push_back(defined[i]._version());
    }
    ctx->save_for_backward(kept);
    at::Tensor out;
    {
      at::NoGradGuard no_grad;
      out = u->recompute(u->arguments(defined));
    }
    // After the forward: a copy to host memory then overlaps the next unit's, and no kernel of
    // this one reads an input while the offload stream does.
    offload_after_forward(*u, defined, moves, versions);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Unit* u = &saved_unit(ctx);
    const uint64_t gen = saved_generation(ctx);
    const int64_t n = ctx->saved_data["num_inputs"].toInt();
    c10::List<bool> needs = ctx->saved_data["needs"].toBoolList();
    u->pre_backward(gen);  // the parameters, gathered again (a no-op when the output hook did it)
    if (u->recompute_generation != gen || !u->recompute)
      throw Error("unit '" + u->fqn + "': the forward to recompute belongs to another step");
    std::vector<at::Tensor> saved = ctx->get_saved_variables(), defined;
    if (u->offloaded.any()) {  // those inputs came back (Unit::pre_backward issued the copies)
      const std::vector<at::Tensor> loaded = loaded_inputs(*u->step->engine_config().device, u->offloaded, u->fqn);
      for (size_t i = 0; i < loaded.size() && i < saved.size(); ++i)
        if (loaded[i].defined()) saved[i] = loaded[i];
    }
    variable_list wrt;
    std::vector<int64_t> input_slot;
    for (int64_t i = 0; i < n; ++i) {
      const bool need = needs.get(static_cast<size_t>(i));
      at::Tensor x = saved[static_cast<size_t>(i)].detach().requires_grad_(need);
      defined.push_back(x);
      if (need) {
        input_slot.push_back(i);
        wrt.push_back(x);
      }
    }
    std::vector<size_t> param_slot;
    const auto& params = u->group.params;
    for (size_t k = 0; k < params.size(); ++k)
      if (params[k].param.requires_grad()) {
        param_slot.push_back(k);
        wrt.push_back(params[k].param);
      }
    at::Tensor out = replay(*u, defined);
    variable_list g = wrt.empty() ? variable_list{}
                                  : torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false,
                                                          /*create_graph=*/false, /*allow_unused=*/true);
    // One gradient per forward argument: none for the unit and the count, then the inputs', then
    // the parameters'.
    variable_list result(static_cast<size_t>(2 + n + static_cast<int64_t>(params.size())));
    for (size_t j = 0; j < input_slot.size(); ++j) result[static_cast<size_t>(2 + input_slot[j])] = g[j];
    for (size_t j = 0; j < param_slot.size(); ++j)
      result[2 + static_cast<size_t>(n) + param_slot[j]] = g[input_slot.size() + j];
    u->drop_recompute();
    return result;
  }
};

}  // namespace

at::Tensor run_recomputed(Unit& u, const std::vector<at::Tensor>& defined) {
  std::vector<at::Tensor> all = defined;
  const auto n = static_cast<int64_t>(all.size());
  for (const ShardedParam& p : u.group.params) all.push_back(p.param);
  return Recompute::apply(&u, n, at::TensorList(all));
}

}  // namespace fsdpx
