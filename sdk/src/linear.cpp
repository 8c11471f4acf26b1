#include "fsdpx/linear.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/float8.h"

namespace fsdpx {

namespace bf16_matmul_generic {
void bf16_matmul_rows(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, uint16_t* c, int64_t ldc,
                      int64_t n, int64_t k, int64_t row_begin, int64_t row_end);
}
#ifdef FSDPX_BF16_MATMUL_AVX2
namespace bf16_matmul_avx2 {
void bf16_matmul_rows(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, uint16_t* c, int64_t ldc,
                      int64_t n, int64_t k, int64_t row_begin, int64_t row_end);
}
#endif

namespace {

using RowsKernel = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, uint16_t*, int64_t, int64_t, int64_t,
                            int64_t, int64_t);

RowsKernel rows_kernel() {
#ifdef FSDPX_BF16_MATMUL_AVX2
  static const RowsKernel kernel = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                                       ? &bf16_matmul_avx2::bf16_matmul_rows
                                       : &bf16_matmul_generic::bf16_matmul_rows;
  return kernel;
#else
  return &bf16_matmul_generic::bf16_matmul_rows;
#endif
}

bool kernel_applies(const at::Tensor& a, const at::Tensor& b) {
  return a.device().is_cpu() && b.device().is_cpu() && a.scalar_type() == at::kBFloat16 &&
         b.scalar_type() == at::kBFloat16 && a.dim() == 2 && b.dim() == 2 && a.is_contiguous() && b.is_contiguous() &&
         a.size(1) == b.size(0) && a.size(0) >= 1 && a.size(1) >= 8 && b.size(1) >= 8;
}

// Operands whose product shows the order of addition: a is ones; column j of b holds +2^24 and
// -2^24 at two rows picked by j and small integers elsewhere, so what the large values absorb
// (fp32 spaces 2 apart there) depends on which partial sum each term joins, and the exact
// product (small) shows it after rounding to bf16.
std::tuple<at::Tensor, at::Tensor> order_probe(int64_t m, int64_t k, int64_t n) {
  at::Tensor a = at::ones({m, k}, at::TensorOptions().dtype(at::kBFloat16));
  at::Tensor b = at::empty({k, n}, at::TensorOptions().dtype(at::kBFloat16));
  auto* bp = reinterpret_cast<uint16_t*>(b.data_ptr<at::BFloat16>());
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  const uint16_t small[15] = {0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80, 0x0000,
                              0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0};  // -7 .. 7
  for (int64_t l = 0; l < k; ++l)
    for (int64_t j = 0; j < n; ++j) bp[l * n + j] = small[mix(static_cast<uint64_t>(l * n + j)) % 15];
  for (int64_t j = 0; j < n; ++j) {
    const auto p = static_cast<int64_t>(mix(0x100000000ULL + j) % static_cast<uint64_t>(k));
    const auto q = (p + 1 + static_cast<int64_t>(mix(0x200000000ULL + j) % static_cast<uint64_t>(k - 1))) % k;
    bp[p * n + j] = 0x4B80;  // 2^24
    bp[q * n + j] = 0xCB80;  // -2^24
  }
  return {a, b};
}

std::atomic<bool> kernel_used{false};

// Whether at::mm gives the reference order's bits for [m, k] @ [k, n] in this process (checked
// once per shape).
bool mm_matches_kernel(int64_t m, int64_t k, int64_t n) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, bool> checked;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(m, k, n);
  auto it = checked.find(key);
  if (it != checked.end()) return it->second;
  at::NoGradGuard no_grad;
  const auto [a, b] = order_probe(m, k, n);
  const bool same = at::mm(a, b).equal(bf16_matmul_reference_order(a, b));
  if (same) kernel_used = true;
  return checked.emplace(key, same).first->second;
}

at::Tensor mm_as_autograd(const at::Tensor& a, const at::Tensor& b) {
  if (kernel_applies(a, b) && mm_matches_kernel(a.size(0), a.size(1), b.size(1)))
    return bf16_matmul_reference_order(a, b);
  return a.mm(b);
}

// y = x W^T as at::linear's autograd computes it (at::matmul folds x to 2-D, then mm), with
// the backward of mm (FunctionsManual's mm_mat1_backward and mm_mat2_backward) spelled out so
// that its input gradient can take the kernel.
struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
    out_shape.back() = weight.size(0);
    at::Tensor y = x.reshape({-1, x.size(-1)}).mm(weight.t());
    return x.dim() == 2 ? y : y.view(out_shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const at::Tensor x2d = x.reshape({-1, x.size(-1)});
    const at::Tensor g2d = x.dim() == 2 ? grads[0] : grads[0].reshape({-1, weight.size(0)});
    const at::Tensor mat2 = weight.t();
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0)) {
      if (x2d.stride(0) == 1 && x2d.stride(1) == x2d.size(0))  // a column-major input: its gradient too
        grad_x = mat2.mm(g2d.t()).t();
      else
        grad_x = mm_as_autograd(g2d, weight);
      if (x.dim() != 2) grad_x = grad_x.reshape(x.sizes());
    }
    if (ctx->needs_input_grad(1)) {
      at::Tensor grad_mat2 = mat2.stride(0) == 1 && mat2.stride(1) == mat2.size(0) ? g2d.t().mm(x2d).t()
                                                                                  : x2d.t().mm(g2d);
      grad_weight = grad_mat2.t();
    }
    return {grad_x, grad_weight};
  }
};

}  // namespace

at::Tensor bf16_matmul_reference_order(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(kernel_applies(a, b), "bf16_matmul_reference_order: needs 2-D contiguous bf16 CPU tensors [m, k] and ",
              "[k, n] with k and n at least 8; got ", a.sizes(), " ", a.scalar_type(), " and ", b.sizes(), " ",
              b.scalar_type());
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  at::Tensor c = at::empty({m, n}, a.options());
  const auto* ap = reinterpret_cast<const uint16_t*>(a.data_ptr<at::BFloat16>());
  const auto* bp = reinterpret_cast<const uint16_t*>(b.data_ptr<at::BFloat16>());
  auto* cp = reinterpret_cast<uint16_t*>(c.data_ptr<at::BFloat16>());
  const RowsKernel kernel = rows_kernel();
  const int64_t blocks = (m + 3) / 4;  // the kernel's blocks of four rows; each output is one thread's
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, 4 * k * n));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    kernel(ap, k, bp, n, cp, n, n, k, b0 * 4, std::min(b1 * 4, m));
  });
  return c;
}

bool linear_uses_bf16_kernel() { return kernel_used; }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight) {
  if (float8_on() && float8_eligible(weight)) return float8_linear(x, weight);
  // A weight without gradient is left to at::linear: at::matmul then folds x only where that
  // needs no copy, a choice the function below would have to repeat.
  const bool differentiable = at::GradMode::is_enabled() && weight.requires_grad();
  if (!differentiable || !x.device().is_cpu() || x.scalar_type() != at::kBFloat16 ||
      weight.scalar_type() != at::kBFloat16 || x.dim() < 2 || weight.dim() != 2)
    return at::linear(x, weight);
  return LinearFunction::apply(x, weight);
}

}  // namespace fsdpx
