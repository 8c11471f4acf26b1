// fsdpx/unit.h: making a layer type wrappable, in one line.
//
// LibTorch modules have no forward hooks, so fsdpx runs its per-unit work (gather the unit's
// parameters before its forward, free them after, arrange the backward) from the holder that
// calls the layer. Declare the layer's holder with FSDPX_MODULE instead of TORCH_MODULE:
//
//   struct BlockImpl : torch::nn::Module {
//     BlockImpl(int64_t dim) : torch::nn::Module("Block") { ... }
//     at::Tensor forward(at::Tensor x);
//   };
//   FSDPX_MODULE(Block);                       // was: TORCH_MODULE(Block);
//
// and call it through the holder, `x = block(x)` (not `block->forward(x)`). Without fsdpx, or
// when the layer is not a unit, the holder calls forward directly. Tensor arguments and an
// at::Tensor result pass through fsdpx's hooks; other arguments pass through untouched.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "fsdpx/export.h"

namespace fsdpx {

// What the sharding engine runs around the forward of a module that is a unit.
class FSDPX_API UnitHooks {
 public:
  virtual ~UnitHooks();
  // Before forward. Receives the forward's tensor arguments in order and returns the tensors to
  // pass instead (same number, same order).
  virtual std::vector<at::Tensor> pre_forward(std::vector<at::Tensor> inputs) = 0;
  // After forward. Receives the result and returns the tensor to give the caller.
  virtual at::Tensor post_forward(at::Tensor output) = 0;
  // ABI 1.1: whether this unit recomputes its forward in backward (activation checkpointing).
  // Then run() keeps `f`, which must own copies of the layer's non-tensor arguments.
  virtual bool recomputes() const { return false; }
  // ABI 1.1: runs the layer's forward `f` on the tensors pre_forward returned. A unit that
  // recomputes runs it without keeping activations and calls it again in backward.
  virtual at::Tensor run(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                         const std::vector<at::Tensor>& inputs) {
    return f(inputs);
  }
};

// Whether `module` was declared with FSDPX_MODULE, so that it can be a unit. Wrap policies that
// choose by size use this to pass over layers the engine cannot hook.
FSDPX_API bool is_wrappable(const torch::nn::Module& module);

namespace detail {
// Records that `module` was declared with FSDPX_MODULE, so the engine may make it a unit.
FSDPX_API void mark_wrappable(const std::shared_ptr<torch::nn::Module>& module);
// The hooks the engine installed for `module`, or nullptr.
FSDPX_API UnitHooks* hooks_of(const torch::nn::Module* module);

template <class A>
constexpr bool is_tensor_v = std::is_same_v<std::decay_t<A>, at::Tensor>;

template <class A>
using passed_t = std::conditional_t<is_tensor_v<A>, at::Tensor, A&&>;

template <class A>
void collect(std::vector<at::Tensor>& out, const A& a) {
  if constexpr (is_tensor_v<A>) out.push_back(a);
}

// The argument to pass for `a`: the next tensor of `in` for a tensor, else `a` itself.
template <class A>
passed_t<A> pick(const std::vector<at::Tensor>& in, size_t& next, A&& a) {
  if constexpr (is_tensor_v<A>) {
    return in[next++];
  } else {
    return std::forward<A>(a);
  }
}

// What a recomputed forward keeps of argument `a`: a copy, or an empty tensor for a tensor (the
// engine hands the tensors in again).
template <class A>
std::decay_t<A> keep(const A& a) {
  if constexpr (is_tensor_v<A>) {
    return at::Tensor();
  } else {
    return a;
  }
}

// The same as pick for a forward that may run twice: other arguments as lvalues.
template <class A>
passed_t<A&> pick_copy(const std::vector<at::Tensor>& in, size_t& next, A& a) {
  if constexpr (is_tensor_v<A>) {
    return in[next++];
  } else {
    return a;
  }
}
}  // namespace detail

// The holder FSDPX_MODULE declares: a torch::nn::ModuleHolder whose call operator runs the
// engine's hooks when its module is a unit.
template <class Impl>
class UnitHolder : public torch::nn::ModuleHolder<Impl> {
  using Base = torch::nn::ModuleHolder<Impl>;

 public:
  UnitHolder() : Base() { mark(); }  // default-constructs the layer, if it can be
  UnitHolder(std::nullptr_t) : Base(nullptr) {}
  UnitHolder(std::shared_ptr<Impl> module) : Base(std::move(module)) { mark(); }
  template <class Head, class... Tail,
            class = std::enable_if_t<!std::is_same_v<std::decay_t<Head>, std::nullptr_t> &&
                                     !std::is_same_v<std::decay_t<Head>, std::shared_ptr<Impl>> &&
                                     !std::is_base_of_v<Base, std::decay_t<Head>>>>
  explicit UnitHolder(Head&& head, Tail&&... tail)
      : Base(std::forward<Head>(head), std::forward<Tail>(tail)...) {
    mark();
  }

  template <class... Args>
  at::Tensor operator()(Args&&... args) {
    Impl* impl = this->get();
    UnitHooks* hooks = detail::hooks_of(impl);
    if (!hooks) return impl->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> inputs;
    (detail::collect(inputs, args), ...);
    inputs = hooks->pre_forward(std::move(inputs));
    if (!hooks->recomputes()) {
      // Called once, inside run(): the arguments as they were given, forwarded.
      auto f = [&](const std::vector<at::Tensor>& tensors) -> at::Tensor {
        size_t next = 0;
        // Braced initialisation evaluates left to right, so tensors are picked in order.
        std::tuple<detail::passed_t<Args>...> passed{detail::pick(tensors, next, std::forward<Args>(args))...};
        return std::apply([impl](auto&&... a) -> at::Tensor { return impl->forward(std::forward<decltype(a)>(a)...); },
                          std::move(passed));
      };
      return hooks->post_forward(hooks->run(f, inputs));
    }
    // Recomputed in backward: the forward must outlive this call, so it owns copies of the
    // non-tensor arguments (the tensors come from the engine each time).
    if constexpr ((std::is_copy_constructible_v<std::decay_t<Args>> && ...)) {
      auto kept = std::make_shared<std::tuple<std::decay_t<Args>...>>(detail::keep(args)...);
      auto f = [impl, kept](const std::vector<at::Tensor>& tensors) -> at::Tensor {
        return std::apply(
            [&](auto&... a) -> at::Tensor {
              size_t next = 0;
              std::tuple<detail::passed_t<decltype(a)&>...> passed{detail::pick_copy(tensors, next, a)...};
              return std::apply(
                  [impl](auto&&... b) -> at::Tensor { return impl->forward(std::forward<decltype(b)>(b)...); },
                  std::move(passed));
            },
            *kept);
      };
      return hooks->post_forward(hooks->run(f, inputs));
    } else {
      throw std::logic_error(std::string("layer ") + impl->name() +
                             ": its forward takes an argument that cannot be copied, so its activations cannot be "
                             "recomputed; do not checkpoint this layer type");
    }
  }

 private:
  void mark() {
    if (!this->is_empty()) detail::mark_wrappable(this->ptr());
  }
};

}  // namespace fsdpx

// Declares `Name`, the holder of `Name##Impl`, as TORCH_MODULE does, and makes the layer
// wrappable by fsdpx (see the top of this file).
#define FSDPX_MODULE(Name)                             \
  class Name : public ::fsdpx::UnitHolder<Name##Impl> { \
   public:                                             \
    using ::fsdpx::UnitHolder<Name##Impl>::UnitHolder; \
  }
