// Native ATen kernels of the sim backend (dispatch key PrivateUse1).
//
// Everything not registered here goes to the boxed fallback
// (sim_fallback.cpp), which runs the CPU kernel on CPU copies. What must be
// native:
//   * factories: empty.memory_format, empty_strided (allocate device memory);
//   * the copy kernels _copy_from / _copy_from_and_resize: the fallback
//     itself moves data with them (at::_to_cpu -> copy_ -> _copy_from, since
//     copy_ re-dispatches to _copy_from for devices it does not know);
//   * view/metadata ops: the fallback cannot produce views (its outputs are
//     copies), so as_strided, view, _reshape_alias, unfold, view_as_real,
//     view_as_complex are registered with the CPU (device-agnostic) impls;
//   * storage-touching metadata ops whose CPU impls would memcpy device bytes
//     on the host: resize_, set_ (4 overloads);
//   * _local_scalar_dense (item()): reads one element;
//   * fill_.Scalar, zero_: native only to avoid a pointless D2H+H2D round trip;
//   * record_stream: CUDA-only in ATen, FSDP calls it;
//   * native_dropout: the CPU kernel draws from the CPU default generator
//     internally (no generator argument the fallback could swap), so we
//     re-express it with bernoulli_ (which the fallback routes to the sim
//     generator); same algorithm as native_dropout_cpu -> bit-identical.
//   * _fused_sdp_choice_stub: without it SDPA on sim takes the math path
//     while CPU takes the CPU flash kernel -> different numerics. The stub
//     asks the CPU heuristic, so sim runs exactly what CPU runs.
#include "fsdpx/sim/sim.h"
#include "sim_order.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>
#include <torch/library.h>

namespace fsdpx::sim {

// Host alias of a sim tensor: a CPU TensorImpl over a CPU Storage that
// aliases the *whole* sim storage (same nbytes, base translated to the host
// view) with the same offset/sizes/strides. Aliasing the storage, not just
// the data pointer, keeps ATen's overlap checks meaningful when src and dst
// of one kernel share a sim storage (both aliases then have equal
// storage().data()).
at::Tensor DeviceAccess::host_alias(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1,
              "sim: host_alias wants a sim tensor, got ", t.device());
  const c10::Storage& st = t.storage();
  void* base = host(st.data());
  c10::Storage cpu_storage(c10::Storage::use_byte_size_t(), st.nbytes(),
                           c10::DataPtr(base, c10::Device(c10::kCPU)),
                           /*allocator=*/nullptr, /*resizable=*/false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

namespace {

constexpr c10::DispatchKeySet kSimKeys(c10::DispatchKey::PrivateUse1);

// ------------------------------------------------------------- factories --
at::Tensor sim_empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                     std::optional<c10::Layout> layout, std::optional<c10::Device> dev,
                     std::optional<bool> pin_memory,
                     std::optional<c10::MemoryFormat> memory_format) {
  const c10::Device d = c10::device_or_default(dev);
  TORCH_CHECK(d.type() == c10::DeviceType::PrivateUse1);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "sim: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory),
              "sim: only CPU tensors can be pinned");
  const c10::DeviceGuard guard(d);  // the allocator uses the current device
  return at::detail::empty_generic(size, allocator(), kSimKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor sim_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                             std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout> layout,
                             std::optional<c10::Device> dev,
                             std::optional<bool> pin_memory) {
  const c10::Device d = c10::device_or_default(dev);
  TORCH_CHECK(d.type() == c10::DeviceType::PrivateUse1);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "sim: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory),
              "sim: only CPU tensors can be pinned");
  const c10::DeviceGuard guard(d);
  return at::detail::empty_strided_generic(size, stride, allocator(), kSimKeys,
                                           c10::dtype_or_default(dtype));
}

// ------------------------------------------------------------------ copies --
// _copy_from(self=src, dst): dispatched on PrivateUse1 when either side is
// sim. Runs the CPU copy kernel (dtype conversion, broadcasting, strides)
// on host aliases. The copy is done when this returns, non_blocking or not,
// but only a blocking copy to the host tells the stream-order check that the
// host waited for the stream (a missing synchronize before reading a
// non_blocking D2H result is not caught).
at::Tensor sim_copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(src.defined() && dst.defined(), "sim: _copy_from of undefined tensor");
  const bool src_sim = src.device().type() == c10::DeviceType::PrivateUse1;
  const bool dst_sim = dst.device().type() == c10::DeviceType::PrivateUse1;
  TORCH_CHECK((src_sim || src.is_cpu()) && (dst_sim || dst.is_cpu()),
              "sim: copies only between sim and CPU, got ", src.device(), " -> ",
              dst.device());
  if (dst.numel() == 0) return dst;
  DeviceAccess acc;
  at::Tensor d = dst_sim ? acc.host_alias(dst) : dst;
  at::Tensor s = src_sim ? acc.host_alias(src) : src;
  d.copy_(s);
  if (src_sim && !dst_sim && !non_blocking) order_host_waits(get_current_stream(src.device().index()));
  return dst;
}

// Defined below.
const at::Tensor& sim_resize_(const at::Tensor& self, c10::IntArrayRef size,
                              std::optional<c10::MemoryFormat> memory_format);

at::Tensor sim_copy_from_and_resize(const at::Tensor& src, const at::Tensor& dst) {
  if (dst.device().type() == c10::DeviceType::PrivateUse1)
    sim_resize_(dst, src.sizes(), std::nullopt);
  else
    at::native::resize_(dst, src.sizes(), std::nullopt);
  return sim_copy_from(src, dst, false);
}

at::Scalar sim_local_scalar_dense(const at::Tensor& self) {
  DeviceAccess acc;
  const at::Scalar value = at::_local_scalar_dense(acc.host_alias(self));
  order_host_waits(get_current_stream(self.device().index()));  // item() waits for the stream
  return value;
}

at::Tensor& sim_fill_(at::Tensor& self, const at::Scalar& value) {
  if (self.numel() == 0) return self;
  DeviceAccess acc;
  acc.host_alias(self).fill_(value);
  return self;
}

at::Tensor& sim_zero_(at::Tensor& self) {
  if (self.numel() == 0) return self;
  DeviceAccess acc;
  acc.host_alias(self).zero_();
  return self;
}

// -------------------------------------------------------- resize and set_ --
// Grow self's storage (never shrink, like CPU/CUDA) if its current
// sizes/strides/offset need more bytes. Uses resize_bytes_sim, which copies
// on the device -- at::native::resize_bytes_cpu would memcpy the device
// bytes from host code and fault.
void grow_storage_for(c10::TensorImpl* impl) {
  if (impl->numel() == 0) return;
  const size_t need = at::detail::computeStorageNbytes(
      impl->sizes(), impl->strides(), impl->dtype().itemsize(),
      impl->storage_offset());
  const c10::Storage& st = impl->unsafe_storage();
  TORCH_INTERNAL_ASSERT(st, "sim: tensor without storage");
  if (need > st.nbytes()) resize_bytes_sim(st.unsafeGetStorageImpl(), need);
}

const at::Tensor& sim_resize_(const at::Tensor& self, c10::IntArrayRef size,
                              std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!self.has_names(), "sim: resize_ of named tensors is not supported");
  auto* impl = self.unsafeGetTensorImpl();
  // Sets sizes (contiguous strides) without touching the storage.
  at::native::resize_impl_cpu_(impl, size, /*stride=*/std::nullopt, /*resize_storage=*/false);
  if (memory_format) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve,
                "Unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  grow_storage_for(impl);
  return self;
}

at::Tensor& sim_set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                                   c10::IntArrayRef size, c10::IntArrayRef stride) {
  // An empty stride list means "contiguous"; checkSetStorage decides that
  // by stride.data() == nullptr.
  if (stride.empty() && !size.empty()) stride = c10::IntArrayRef();
  at::native::checkSetStorage(self, std::move(source), offset, size, stride);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(offset);
  at::OptionalIntArrayRef st =
      stride.data() ? at::OptionalIntArrayRef(stride) : std::nullopt;
  at::native::resize_impl_cpu_(impl, size, st, /*resize_storage=*/false);
  grow_storage_for(impl);
  return self;
}

at::Tensor& sim_set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return sim_set_storage_offset(self, std::move(source), 0, {n}, {});
}

at::Tensor& sim_set_tensor(at::Tensor& self, const at::Tensor& src) {
  if (self.unsafeGetTensorImpl() == src.unsafeGetTensorImpl()) return self;
  return sim_set_storage_offset(self, src.storage(), src.storage_offset(), src.sizes(),
                                src.strides());
}

at::Tensor& sim_set_empty(at::Tensor& self) {
  c10::Storage fresh(c10::Storage::use_byte_size_t(), 0, allocator(), /*resizable=*/true);
  return sim_set_storage_offset(self, std::move(fresh), 0, {0}, {});
}

// ------------------------------------------------------------------ views --
at::Tensor sim_as_strided(const at::Tensor& self, c10::IntArrayRef size,
                          c10::IntArrayRef stride, std::optional<int64_t> offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}

// ------------------------------------------------------------------- misc --
void sim_record_stream(at::Tensor& self, c10::Stream s) {
  allocator()->recordStream(self.storage().data_ptr(), s);
}

std::tuple<at::Tensor, at::Tensor> sim_native_dropout(const at::Tensor& input, double p,
                                                      std::optional<bool> train) {
  if (input.numel() == 0)
    return std::make_tuple(input, at::empty_like(input, input.options()));
  if (!train.has_value() || *train) {
    const double p1m = 1. - p;
    const double scale = p1m == 0 ? 0. : 1. / p1m;
    at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
    mask.bernoulli_(p1m);  // fallback -> sim generator's CPU twin
    at::Tensor out = input.mul(mask).mul_(scale);
    return std::make_tuple(out, mask);
  }
  return std::make_tuple(input.clone(), at::ones_like(input, input.options().dtype(at::kBool)));
}

int64_t sim_fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& mask, double dropout_p,
                             bool is_causal, std::optional<double> scale, bool enable_gqa) {
  // The CPU heuristic only looks at metadata (dtype, shapes, strides, flags).
  // (Calling _fused_sdp_choice_stub(kCPU, ...) does not link: the stub's
  // DispatchStubImpl::get_call_ptr is not exported from libtorch_cpu.)
  return at::native::_fused_sdp_choice_cpp(q, k, v, mask, dropout_p, is_causal, scale,
                                           enable_gqa);
}

}  // namespace

}  // namespace fsdpx::sim

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &fsdpx::sim::sim_fused_sdp_choice)
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace fsdpx::sim;
  m.impl("empty.memory_format", sim_empty);
  m.impl("empty_strided", sim_empty_strided);
  m.impl("_copy_from", sim_copy_from);
  m.impl("_copy_from_and_resize", sim_copy_from_and_resize);
  m.impl("_local_scalar_dense", sim_local_scalar_dense);
  m.impl("fill_.Scalar", sim_fill_);
  m.impl("zero_", sim_zero_);
  m.impl("resize_", sim_resize_);
  m.impl("set_.source_Storage_storage_offset", sim_set_storage_offset);
  m.impl("set_.source_Storage", sim_set_storage);
  m.impl("set_.source_Tensor", sim_set_tensor);
  m.impl("set_", sim_set_empty);
  m.impl("as_strided", sim_as_strided);
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("record_stream", sim_record_stream);
  m.impl("native_dropout", sim_native_dropout);
  m.impl("_fused_sdp_choice", sim_fused_sdp_choice);
}
