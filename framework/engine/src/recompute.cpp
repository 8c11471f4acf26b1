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

// Whether the unit's inputs go to host memory (activation offload, on a device).
bool offloads(const Unit& u) { return u.offload && !u.step->engine_config().device->is_cpu(); }

// Activation offload, after the unit's forward: the inputs that move go to host memory, and an
// undefined tensor holds their place among those saved. `versions`: the inputs' version counters
// before the forward; one that changed in place is refused (its copy would not be the input).
void offload_inputs_of(AutogradContext* ctx, Unit& u, const std::vector<at::Tensor>& defined,
                       const std::vector<int64_t>& versions) {
  for (size_t i = 0; i < defined.size(); ++i)
    if (defined[i]._version() != versions[i])
      throw Error("unit '" + u.fqn + "' changed its input " + std::to_string(i) + " in place during its forward, "
                  "and activation offload copies a unit's inputs after its forward; take the unit out of the "
                  "offloaded ones, or make its forward leave its inputs as they are");
  const DeviceRuntime& device = *u.step->engine_config().device;
  u.step->release_offloading();  // the previous unit's copies are done: its inputs may go
  u.offloaded.clear();
  u.offloaded.host = offload_inputs(device, defined);
  std::vector<at::Tensor> kept, moving;
  for (size_t i = 0; i < defined.size(); ++i) {
    const bool moved = u.offloaded.host[i].defined();
    kept.push_back(moved ? at::Tensor() : defined[i]);
    if (moved) moving.push_back(defined[i]);
  }
  ctx->save_for_backward(kept);
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
    const bool offloading = offloads(*u);
    std::vector<int64_t> versions;
    if (offloading) {
      for (const auto& t : defined) versions.push_back(t._version());
    } else {
      ctx->save_for_backward(defined);  // before the forward: autograd then sees a change in place
    }
    at::Tensor out;
    {
      at::NoGradGuard no_grad;
      out = u->recompute(u->arguments(defined));
    }
    // After the forward: a copy to host memory then overlaps the next unit's, and no kernel of
    // this one reads an input while the offload stream does.
    if (offloading) offload_inputs_of(ctx, *u, defined, versions);
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
      const std::vector<at::Tensor> loaded = loaded_inputs(*u->step->engine_config().device, u->offloaded);
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
