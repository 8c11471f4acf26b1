#include "sharding_unit.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "engine_state.h"
#include "fsdpx/error.h"
#include "fsdpx/float8.h"
#include "fsdpx/framework/runtime/collective_context.h"
#include "recompute.h"

namespace fsdpx {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The identity on a unit's inputs. Its backward runs once the unit's backward has produced the
// gradients of its inputs, after its parameters' gradients were accumulated: post-backward.
// (The inputs travel as at::TensorList: LibTorch's custom functions take a std::vector of
// tensors for a plain argument, and the outputs would then have no history.)
struct PostBackward : public torch::autograd::Function<PostBackward> {
  static variable_list forward(AutogradContext* ctx, const Unit* unit, at::TensorList inputs) {
    save_unit(ctx, *unit);
    variable_list out;
    for (const auto& t : inputs) out.push_back(t.view_as(t));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    saved_unit(ctx).post_backward(saved_generation(ctx));
    variable_list out{at::Tensor()};
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  }
};

}  // namespace

void save_unit(AutogradContext* ctx, const Unit& u) {
  ctx->saved_data["engine"] = u.step->engine_id();
  ctx->saved_data["unit"] = u.index;
  ctx->saved_data["fqn"] = u.fqn;
  ctx->saved_data["generation"] = static_cast<int64_t>(u.step->generation());
}

Unit& saved_unit(AutogradContext* ctx) {
  return live_unit(ctx->saved_data["engine"].toInt(), ctx->saved_data["unit"].toInt(),
                   ctx->saved_data["fqn"].toStringRef());
}

uint64_t saved_generation(AutogradContext* ctx) { return static_cast<uint64_t>(ctx->saved_data["generation"].toInt()); }

std::vector<at::Tensor> Unit::pre_forward(std::vector<at::Tensor> inputs) {
  step->forward_began(*this);  // first: a unit run outside the engine's forward is refused as such
  if (forward_calls++ > 0)
    throw Error("unit '" + fqn + "' ran its forward twice in one step; fsdpx gathers and reduces a unit once per "
                "step, so a layer called twice must not be a unit (wrap its parent instead)");
  const PrecisionSpec& prec = group.precision;
  if (prec.cast_forward_inputs)
    for (auto& t : inputs)
      if (t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != prec.compute) t = t.to(prec.compute);
  group.unshard();
  step->prefetch_after(*this, /*backward=*/false);
  if (!at::GradMode::is_enabled()) return inputs;
  std::vector<size_t> idx;
  variable_list needs;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      idx.push_back(i);
      needs.push_back(inputs[i]);
    }
  if (needs.empty()) return inputs;
  variable_list wrapped = PostBackward::apply(this, at::TensorList(needs));
  for (size_t k = 0; k < idx.size(); ++k) inputs[idx[k]] = wrapped[k];
  return inputs;
}

bool Unit::recomputes() const { return checkpoint && at::GradMode::is_enabled(); }

at::Tensor Unit::run(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& layer,
                     const std::vector<at::Tensor>& inputs) {
  // Float8 (or not) for this unit's own layers, in its forward and in its recompute; a unit
  // inside sets its own and hands this one's back. Float8 is off outside every scope (and so in
  // a backward's recompute), so a unit that is not float8 under no float8 scope runs as given.
  const bool scoped = float8 || float8_on();
  const std::function<at::Tensor(const std::vector<at::Tensor>&)> f =
      scoped ? std::function<at::Tensor(const std::vector<at::Tensor>&)>(
                   [layer, on = float8](const std::vector<at::Tensor>& in) {
                     Float8Scope scope(on);
                     return layer(in);
                   })
             : layer;
  if (!recomputes()) {
    drop_recompute();
    return f(inputs);
  }
  recompute = f;
  recompute_generation = step->generation();
  recompute_arity = inputs.size();
  recompute_slots.clear();
  std::vector<at::Tensor> defined;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined()) {
      recompute_slots.push_back(static_cast<int64_t>(i));
      defined.push_back(inputs[i]);
    }
  return run_recomputed(*this, defined);
}

at::Tensor Unit::post_forward(at::Tensor output) {
  if (group.reshard_after_forward()) group.reshard();
  const auto& out_dtype = group.precision.output;
  if (root && out_dtype && output.defined() && at::isFloatingType(output.scalar_type()) &&
      output.scalar_type() != *out_dtype)
    output = output.to(*out_dtype);
  // A unit with a compute dtype of its own hands its output back in the root's, so that the code
  // around it (the root's own layers) computes as it would without it.
  const c10::ScalarType around = step->engine_config().options.precision.compute;
  if (!root && group.precision.compute != around && output.defined() && at::isFloatingType(output.scalar_type()) &&
      output.scalar_type() != around)
    output = output.to(around);
  if (at::GradMode::is_enabled() && output.defined() && output.requires_grad()) {
    // By id, not `this`: the output may outlive the engine.
    output.register_hook(
        [engine = step->engine_id(), index = index, name = fqn, gen = step->generation()](const at::Tensor& grad) {
          live_unit(engine, index, name).pre_backward(gen);
          return grad;
        });
  }
  return output;
}

void Unit::pre_backward(uint64_t gen) {
  CollectivePhase phase("backward");  // autograd may run this on a thread of its own
  step->check_generation(gen, fqn);
  if (stage != BackwardStage::Waiting) return;
  stage = BackwardStage::Computing;
  step->backward_began(gen);
  group.take_gradients();  // before autograd accumulates into the parameters' .grad
  group.unshard();
  step->load_offloaded(*this);  // its inputs, and the next unit's, on the offload stream meanwhile
  if (progress_elements == 0) progress();  // no gradient will come to count
}

void Unit::on_parameter_gradient(int64_t elements) {
  if (stage != BackwardStage::Computing) return;
  grad_elements_seen += elements;
  if (grad_elements_seen >= progress_elements) progress();
}

void Unit::progress() {
  if (stage != BackwardStage::Computing) return;
  stage = BackwardStage::Progressed;
  CollectivePhase phase("backward");
  step->finish_in_flight_reduce();
  step->prefetch_after(*this, /*backward=*/true);
}

void Unit::post_backward(uint64_t gen) {
  step->check_generation(gen, fqn);
  post_backward();
}

void Unit::post_backward() {
  CollectivePhase phase("backward");
  if (stage == BackwardStage::Done) return;
  if (stage == BackwardStage::Computing) progress();  // the same collectives, in the same order, on every rank
  stage = BackwardStage::Done;
  group.take_gradients();  // a unit no gradient reached: what was done to the shown ones counts
  group.reshard();  // first, as FSDP2 does: the gathered parameters are not needed any more
  group.drop_post_forward();
  step->reduce(group);
}

void Unit::begin_step() {
  drop_recompute();
  group.drop_post_forward();  // a forward with no backward after it kept it
  forward_calls = 0;
  stage = BackwardStage::Waiting;
  grad_elements_seen = 0;
}

std::vector<at::Tensor> Unit::arguments(const std::vector<at::Tensor>& defined) const {
  std::vector<at::Tensor> out(recompute_arity);
  for (size_t k = 0; k < recompute_slots.size() && k < defined.size(); ++k)
    out[static_cast<size_t>(recompute_slots[k])] = defined[k];
  return out;
}

void Unit::drop_recompute() {
  recompute = nullptr;
  recompute_slots.clear();
  recompute_rng = at::Tensor();
  offloaded.clear();
}

}  // namespace fsdpx
