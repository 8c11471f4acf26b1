// Boxed fallback: every aten op without a PrivateUse1 kernel runs here.
//
// We delegate to at::native::cpu_fallback, which (2.11):
//   1. copies every sim Tensor / Tensor[] / Tensor?[] argument to CPU with
//      at::_to_cpu (-> our _copy_from), replaces Device args by cpu;
//   2. redispatches the op to the CPU kernel;
//   3. copies mutated inputs back with at::_copy_from_and_resize (ours);
//   4. moves returned tensors to the target device (.to(sim) -> ours).
// So device bytes are only ever touched inside our copy kernels, under a
// DeviceAccess scope: the fallback needs no protection handling of its own.
//
// Added on top:
//   * generator routing (see sim_generator.cpp): Generator? arguments that
//     are sim generators are replaced by their CPU twins; absent ones by the
//     twin of the default generator of the op's sim device.
//   * error_on_views=true: a view op reaching the fallback would silently
//     return a copy (breaking aliasing, e.g. FSDP's views into flat
//     buffers); we prefer a loud error and a native registration.
#include "fsdpx/sim/sim.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>


namespace fsdpx::sim {

namespace {

bool is_generator_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  if (t->kind() == c10::TypeKind::OptionalType)
    return t->castRaw<c10::OptionalType>()->getElementType()->kind() ==
           c10::TypeKind::GeneratorType;
  return false;
}

// Device index of the first sim tensor among the op's arguments.
c10::DeviceIndex sim_device_of(c10::ArrayRef<c10::IValue> args) {
  for (const auto& v : args) {
    if (v.isTensor()) {
      const auto& t = v.toTensor();
      if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1)
        return t.device().index();
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec())
        if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1)
          return t.device().index();
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      return v.toDevice().index();
    }
  }
  return current_device();
}

void route_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema_args = op.schema().arguments();
  const size_t n = schema_args.size();
  const size_t begin = stack->size() - n;
  for (size_t i = 0; i < n; ++i) {
    if (!is_generator_type(schema_args[i].type())) continue;
    c10::IValue& v = (*stack)[begin + i];
    if (v.isNone()) {
      const auto args = c10::ArrayRef<c10::IValue>(stack->data() + begin, n);
      v = c10::IValue(cpu_twin(default_generator(sim_device_of(args))));
    } else if (v.isGenerator()) {
      const at::Generator& g = v.toGenerator();
      if (g.defined() && g.device().type() == c10::DeviceType::PrivateUse1)
        v = c10::IValue(cpu_twin(g));
    }
  }
}

void sim_boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  route_generators(op, stack);
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

}  // namespace

}  // namespace fsdpx::sim

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fsdpx::sim::sim_boxed_fallback>());
}
