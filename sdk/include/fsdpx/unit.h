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
  // ABI 1.1: runs the layer's forward `f` on the tensors pre_forward returned. The engine may
  // run it without keeping its activations and run it again in backward (activation
  // checkpointing), so `f` must be callable twice with the same result.
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

// The argument to pass for `a`: the next tensor of `in` for a tensor, else `a` itself (as an
// lvalue: the forward may run twice).
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
    // The forward as a function of the tensor arguments; the others are kept by value, so that
    // it can run again in backward (activation checkpointing).
    auto others = std::make_shared<std::tuple<std::decay_t<Args>...>>(args...);
    auto f = [impl, others](const std::vector<at::Tensor>& tensors) -> at::Tensor {
      return std::apply(
          [&](auto&... a) -> at::Tensor {
            size_t next = 0;
            // Braced initialisation evaluates left to right, so tensors are picked in order.
            std::tuple<detail::passed_t<decltype(a)&>...> passed{detail::pick_copy(tensors, next, a)...};
            return std::apply([impl](auto&&... b) -> at::Tensor { return impl->forward(std::forward<decltype(b)>(b)...); },
                              std::move(passed));
          },
          *others);
    };
    return hooks->post_forward(hooks->run(f, inputs));
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
