// Compiled with -O3 -fno-math-errno -ffp-contract=off (plugins/CMakeLists.txt): the loops below
// vectorise (sqrt without errno), and no multiply-add is fused, so every CPU gives the same bits
// as the scalar code. Each range function is cloned for AVX-512, AVX2 and baseline x86-64 and
// the loader picks the clone for the CPU it runs on.
#include "update_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FSDPX_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FSDPX_CLONES
#endif
#define FSDPX_INLINE inline __attribute__((always_inline))

namespace fsdpx_anyprecision {
namespace kernel {

constexpr int64_t kBlock = 128;  // elements per block (measured best of 64..2048 on 20M elements): buffers stay in L1

struct Operand {
  void* data = nullptr;
  at::ScalarType type = at::kFloat;
};
struct Operands {
  Operand p, g, m, v, c;
};

FSDPX_INLINE float float_of_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as c10::BFloat16 does; NaN stays a (quiet) NaN.
FSDPX_INLINE uint16_t bf16_of_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

template <typename Acc>
FSDPX_INLINE void widen(const Operand& o, int64_t first, int64_t n, Acc* out) {
  switch (o.type) {
    case at::kFloat: {
      const float* s = static_cast<const float*>(o.data) + first;
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Acc>(s[i]);
      break;
    }
    case at::kDouble: {
      const double* s = static_cast<const double*>(o.data) + first;
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Acc>(s[i]);
      break;
    }
    case at::kBFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(o.data) + first;
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Acc>(float_of_bf16(s[i]));
      break;
    }
    default: {  // kHalf (fused_update_applies admits nothing else)
      const c10::Half* s = static_cast<const c10::Half*>(o.data) + first;
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Acc>(static_cast<float>(s[i]));
      break;
    }
  }
}

template <typename Acc>
FSDPX_INLINE void narrow(const Acc* in, int64_t n, const Operand& o, int64_t first) {
  switch (o.type) {
    case at::kFloat: {
      float* d = static_cast<float*>(o.data) + first;
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(in[i]);
      break;
    }
    case at::kDouble: {
      double* d = static_cast<double*>(o.data) + first;
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<double>(in[i]);
      break;
    }
    case at::kBFloat16: {
      uint16_t* d = static_cast<uint16_t*>(o.data) + first;
      for (int64_t i = 0; i < n; ++i) d[i] = bf16_of_float(static_cast<float>(in[i]));
      break;
    }
    default: {
      c10::Half* d = static_cast<c10::Half*>(o.data) + first;
      for (int64_t i = 0; i < n; ++i) d[i] = c10::Half(static_cast<float>(in[i]));
      break;
    }
  }
}

template <typename Acc>
constexpr at::ScalarType kNative = std::is_same_v<Acc, double> ? at::kDouble : at::kFloat;

// An operand's block in the compute type: the tensor's own memory when it already is of that
// type (no copy), else `buffer`, widened from it.
template <typename Acc>
FSDPX_INLINE Acc* block_of(const Operand& o, int64_t first, int64_t n, Acc* buffer) {
  if (o.type == kNative<Acc>) return static_cast<Acc*>(o.data) + first;
  widen(o, first, n, buffer);
  return buffer;
}
// Writes a widened block back (nothing to do for an operand updated in place).
template <typename Acc>
FSDPX_INLINE void store(const Acc* block, int64_t n, const Operand& o, int64_t first) {
  if (o.type != kNative<Acc>) narrow(block, n, o, first);
}

template <typename Acc, bool kKahan>
FSDPX_INLINE void update_block(const Operands& ops, int64_t first, int64_t n, const StepConstants& k) {
  alignas(64) Acc p_buf[kBlock], g_buf[kBlock], m_buf[kBlock], v_buf[kBlock], c_buf[kBlock], old[kBlock];
  // Distinct tensors (or distinct buffers): no two of these overlap.
  Acc* __restrict__ p = block_of(ops.p, first, n, p_buf);
  const Acc* __restrict__ g = block_of(ops.g, first, n, g_buf);
  Acc* __restrict__ m = block_of(ops.m, first, n, m_buf);
  Acc* __restrict__ v = block_of(ops.v, first, n, v_buf);
  Acc* __restrict__ c = kKahan ? block_of(ops.c, first, n, c_buf) : c_buf;
  const Acc decay = static_cast<Acc>(k.decay), b1 = static_cast<Acc>(k.b1), b2 = static_cast<Acc>(k.b2);
  const Acc one_b1 = static_cast<Acc>(1.0 - k.b1), one_b2 = static_cast<Acc>(1.0 - k.b2);
  // 1 / sqrt(1 - b2^t) as a factor: one division per element (the update's) instead of two.
  const Acc eps = static_cast<Acc>(k.eps), step_size = static_cast<Acc>(k.step_size),
            inv_bc2 = static_cast<Acc>(1.0 / k.bc2_sqrt);
  for (int64_t i = 0; i < n; ++i) {
    const Acc pi = p[i] * decay, gi = g[i];
    const Acc mi = b1 * m[i] + one_b1 * gi;
    const Acc vi = b2 * v[i] + one_b2 * (gi * gi);
    const Acc u = step_size * mi / (std::sqrt(vi) * inv_bc2 + eps);
    m[i] = mi;
    v[i] = vi;
    if constexpr (kKahan) {
      c[i] -= u;
      p[i] = pi + c[i];
      old[i] = pi;
    } else {
      p[i] = pi - u;
    }
  }
  store(m, n, ops.m, first);
  store(v, n, ops.v, first);
  store(p, n, ops.p, first);
  if constexpr (kKahan) {
    if (ops.p.type != kNative<Acc>) widen(ops.p, first, n, p);  // what the parameter's dtype kept of p + c
    for (int64_t i = 0; i < n; ++i) c[i] += old[i] - p[i];
    store(c, n, ops.c, first);
  }
}

template <typename Acc, bool kKahan>
FSDPX_INLINE void update_range(const Operands& ops, int64_t begin, int64_t end, const StepConstants& k) {
  for (int64_t first = begin; first < end; first += kBlock)
    update_block<Acc, kKahan>(ops, first, std::min(kBlock, end - first), k);
}

// Not static: GCC's target_clones wants external linkage for its resolver.
FSDPX_CLONES void range_float(const Operands& ops, int64_t begin, int64_t end, const StepConstants& k) {
  update_range<float, false>(ops, begin, end, k);
}
FSDPX_CLONES void range_float_kahan(const Operands& ops, int64_t begin, int64_t end, const StepConstants& k) {
  update_range<float, true>(ops, begin, end, k);
}
FSDPX_CLONES void range_double(const Operands& ops, int64_t begin, int64_t end, const StepConstants& k) {
  update_range<double, false>(ops, begin, end, k);
}
FSDPX_CLONES void range_double_kahan(const Operands& ops, int64_t begin, int64_t end, const StepConstants& k) {
  update_range<double, true>(ops, begin, end, k);
}

bool supported(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble;
}

}  // namespace kernel

bool fused_update_applies(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_sq, const at::Tensor& compensation) {
  for (const at::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq, &compensation}) {
    if (t == &compensation && !t->defined()) continue;
    if (!t->defined() || !t->device().is_cpu() || !t->is_contiguous() || t->numel() != param.numel() ||
        !kernel::supported(t->scalar_type()))
      return false;
  }
  return grad.scalar_type() == param.scalar_type();
}

void update_in_place(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                     const at::Tensor& exp_avg_sq, const at::Tensor& compensation, const StepConstants& k) {
  using kernel::Operand;
  auto operand = [](const at::Tensor& t) { return t.defined() ? Operand{t.data_ptr(), t.scalar_type()} : Operand{}; };
  const kernel::Operands ops{operand(param), operand(grad), operand(exp_avg), operand(exp_avg_sq),
                             operand(compensation)};
  const bool kahan = compensation.defined();
  bool wide = false;
  for (const at::Tensor* t : {&param, &exp_avg, &exp_avg_sq, &compensation})
    wide = wide || (t->defined() && t->scalar_type() == at::kDouble);
  auto* range = wide ? (kahan ? kernel::range_double_kahan : kernel::range_double)
                     : (kahan ? kernel::range_float_kahan : kernel::range_float);
  const int64_t n = param.numel(), blocks = (n + kernel::kBlock - 1) / kernel::kBlock;
  // At least 256 blocks (32k elements) per task.
  at::parallel_for(0, blocks, /*grain_size=*/256, [&](int64_t b0, int64_t b1) {
    range(ops, b0 * kernel::kBlock, std::min(n, b1 * kernel::kBlock), k);
  });
}

}  // namespace fsdpx_anyprecision
