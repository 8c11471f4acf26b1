// Boxed fallback: every aten op without a PrivateUse1 kernel runs here, as the
// CPU's kernel on host aliases of the device memory (DeviceAccess::host_alias:
// the same bytes, sizes, strides and offset, for as long as the kernel runs).
//   1. every sim Tensor / Tensor[] / Tensor?[] argument becomes its alias, a
//      sim Device argument the CPU;
//   2. the op's CPU kernel runs (redispatched with the CPU key): in-place and
//      out= arguments are written in device memory directly;
//   3. a returned alias becomes its sim tensor again, a view of an alias the
//      same view of the sim tensor, and a new CPU result a sim tensor of the
//      same strides (copied once).
// Because every kernel sees the very layouts it sees on the CPU, a run on sim
// gives the CPU's bits (LibTorch's copying cpu_fallback hands kernels
// contiguous copies, whose reductions then add in another order). A kernel
// that must grow an out= argument (an alias cannot be resized) is run again
// through LibTorch's copying fallback.
//
// Generator? arguments are routed (see sim_generator.cpp): a sim generator
// becomes its CPU twin; an absent one the twin of the default generator of
// the op's sim device.
#include "fsdpx/sim/sim.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

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

bool is_sim(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

// The host aliases of one kernel's sim arguments, and the way back for its results.
class Aliases {
 public:
  at::Tensor to_host(const at::Tensor& t) {
    if (!is_sim(t)) return t;
    if (!target_) target_ = t.device();
    at::Tensor a = access_.host_alias(t);
    pairs_.emplace_back(a, t);
    return a;
  }
  c10::IValue to_host(const c10::IValue& v) {
    if (v.isTensor()) return to_host(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(to_host(t));
      return out;
    }
    if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> out;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList().vec())
        out.push_back(t ? std::optional<at::Tensor>(to_host(*t)) : std::nullopt);
      return out;
    }
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {  // a factory's device
      if (!target_) target_ = v.toDevice();
      return c10::Device(c10::kCPU);
    }
    return v;
  }
  // The sim tensor a CPU result stands for.
  at::Tensor back(const at::Tensor& r) {
    if (!r.defined() || !r.device().is_cpu() || !target_) return r;
    for (const auto& [alias, original] : pairs_) {
      if (r.unsafeGetTensorImpl() == alias.unsafeGetTensorImpl()) return original;  // in place
      if (r.storage().data() == alias.storage().data() && r.storage().data() != nullptr) {  // a view
        at::Tensor view = at::empty({0}, original.options());
        view.set_(original.storage(), r.storage_offset(), r.sizes(), r.strides());
        return view;
      }
    }
    c10::DeviceGuard guard(*target_);
    at::Tensor out = at::empty_strided(r.sizes(), r.strides(), r.options().device(*target_));
    if (out.numel() > 0) access_.host_alias(out).copy_(r);
    return out;
  }
  c10::IValue back(const c10::IValue& v) {
    if (v.isTensor()) return back(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(back(t));
      return out;
    }
    return v;
  }

 private:
  DeviceAccess access_;  // the aliases are valid while it lives
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs_;  // (alias, sim tensor)
  std::optional<c10::Device> target_;
};

void sim_boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  route_generators(op, stack);
  const size_t n_args = op.schema().arguments().size(), begin = stack->size() - n_args;
  const std::vector<c10::IValue> arguments(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
  Aliases aliases;
  for (size_t i = begin; i < stack->size(); ++i) (*stack)[i] = aliases.to_host((*stack)[i]);
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  } catch (const c10::Error& e) {
    if (std::string(e.what()).find("not resizable") == std::string::npos) throw;
    stack->resize(begin);  // an out= argument to grow: the copying fallback, from the arguments
    stack->insert(stack->end(), arguments.begin(), arguments.end());
    at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
    return;
  }
  const size_t n_returns = op.schema().returns().size();
  for (size_t i = stack->size() - n_returns; i < stack->size(); ++i) (*stack)[i] = aliases.back((*stack)[i]);
}

// PrivateUse1 kernels of our own (sim_ops.cpp), and ops that must keep LibTorch's device-generic
// kernels: not routed to the CPU's.
bool keeps_its_kernel(const std::string& op) {
  static const char* const own[] = {"empty",
                                    "empty_strided",
                                    "_copy_from",
                                    "_copy_from_and_resize",
                                    "_local_scalar_dense",
                                    "fill_",
                                    "zero_",
                                    "resize_",
                                    "set_",
                                    "as_strided",
                                    "view",
                                    "_reshape_alias",
                                    "unfold",
                                    "view_as_real",
                                    "view_as_complex",
                                    "record_stream",
                                    "native_dropout",
                                    "_fused_sdp_choice",
                                    "copy_",
                                    "_to_copy",
                                    "to",
                                    "clone"};
  for (const char* name : own)
    if (op == name) return true;
  return false;
}

// Whether the op returns a view of an input (an alias it does not write): it must stay a view.
bool returns_a_view(const c10::FunctionSchema& schema) {
  for (const auto& r : schema.returns())
    if (r.alias_info() && !r.alias_info()->isWrite()) return true;
  return false;
}

// A device without kernels of its own takes an op's composite kernel when it has one, and that
// decomposes into other ops where the CPU runs one fused kernel, rounding otherwise (SiLU's
// backward, for one). So every aten op with a CPU kernel and a composite one is routed to the
// CPU kernel through the fallback: sim computes what the CPU computes, op for op.
void route_composites_to_cpu_kernels() {
  using c10::DispatchKey;
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op || !op->hasSchema() || !op->hasKernelForDispatchKey(DispatchKey::CPU)) continue;
    if (!op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional) &&
        !op->hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd))
      continue;
    const std::string op_name = name.name.substr(6);
    if (keeps_its_kernel(op_name) || returns_a_view(op->schema()) ||
        op->hasKernelForDispatchKey(DispatchKey::PrivateUse1))
      continue;
    const std::string full = name.overload_name.empty() ? op_name : op_name + "." + name.overload_name;
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&sim_boxed_fallback>());
  }
}

// After LibTorch's registrations (its libraries load before this one) and ours (TORCH_LIBRARY_IMPL
// below runs at this library's load too: keeps_its_kernel names them, whatever the order).
const bool routed = [] {
  route_composites_to_cpu_kernels();
  return true;
}();
}  // namespace

}  // namespace fsdpx::sim

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fsdpx::sim::sim_boxed_fallback>());
}
