// fsdpx::linear: values and gradients equal to at::linear's to the last bit (bf16 and fp32, 2-D
// and 3-D inputs, non-contiguous inputs, either operand without gradient); its bf16 kernel adds
// in the documented order (checked against a plain loop); and it takes that kernel exactly where
// this machine's at::mm adds in that order.
#include <array>
#include <vector>

#include <ATen/ops/linear.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/linear.h"

namespace fsdpx {
namespace {

// The order fsdpx/linear.h promises, one output at a time: four fp32 partial sums over
// l = 0, 1, 2, 3 (mod 4), the tail into the first, then ((p0 + p1) + p2) + p3, rounded to bf16.
at::Tensor reference_loop(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor af = a.to(at::kFloat).contiguous(), bf = b.to(at::kFloat).contiguous();
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1), k4 = k - k % 4;
  const float *ap = af.data_ptr<float>(), *bp = bf.data_ptr<float>();
  std::vector<float> out(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int64_t l = 0; l < k; ++l) {
        const float product = ap[i * k + l] * bp[l * n + j];
        p[l < k4 ? l % 4 : 0] += product;
      }
      out[i * n + j] = ((p[0] + p[1]) + p[2]) + p[3];
    }
  return at::from_blob(out.data(), {m, n}, at::TensorOptions().dtype(at::kFloat)).to(at::kBFloat16);
}

TEST(Linear, KernelAddsInTheReferenceOrder) {
  at::manual_seed(7);
  for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{{5, 8, 8}, {37, 67, 70}, {64, 256, 129}, {3, 9, 200}}) {
    const at::Tensor a = at::randn({m, k}).to(at::kBFloat16), b = at::randn({k, n}).to(at::kBFloat16);
    EXPECT_TRUE(bf16_matmul_reference_order(a, b).equal(reference_loop(a, b))) << m << "x" << k << "x" << n;
  }
  // Large and small terms, where the order shows: the loop's own check of what it tests.
  at::Tensor a = at::ones({2, 9}).to(at::kBFloat16), b = at::ones({9, 8}).to(at::kBFloat16);
  b[0].fill_(16777216.0);  // 2^24 absorbs the 1s added to the same partial sum
  b[4].fill_(-16777216.0);
  EXPECT_TRUE(bf16_matmul_reference_order(a, b).equal(reference_loop(a, b)));
  EXPECT_THROW(bf16_matmul_reference_order(a.to(at::kFloat), b), c10::Error);
}

struct Case {
  at::ScalarType dtype;
  std::vector<int64_t> x_shape;
  bool transposed_x, x_grad, w_grad;
};

TEST(Linear, ValuesAndGradientsAreAtLinearsBits) {
  at::manual_seed(3);
  const std::vector<Case> cases = {
      {at::kBFloat16, {4, 33, 67}, false, true, true},  {at::kBFloat16, {130, 64}, false, true, true},
      {at::kBFloat16, {2, 40, 64}, true, true, true},   {at::kBFloat16, {3, 16, 64}, false, false, true},
      {at::kBFloat16, {3, 16, 64}, false, true, false}, {at::kFloat, {4, 33, 67}, false, true, true},
      {at::kFloat, {2, 40, 64}, true, true, true}};
  for (const Case& c : cases) {
    const int64_t in = c.x_shape.back(), out = 72;
    at::Tensor x0 = at::randn(c.x_shape).to(c.dtype);
    if (c.transposed_x)  // the same shape, other strides: the last two dimensions laid out swapped
      x0 = x0.transpose(-1, -2).contiguous().transpose(-1, -2);
    const at::Tensor w0 = (at::randn({out, in}) * 0.1).to(c.dtype);
    std::vector<at::Tensor> grads[2];
    at::Tensor y[2];
    for (int path = 0; path < 2; ++path) {
      at::Tensor x = x0.detach().clone(at::MemoryFormat::Preserve).requires_grad_(c.x_grad);
      at::Tensor w = w0.detach().clone().requires_grad_(c.w_grad);
      y[path] = path == 0 ? at::linear(x, w) : fsdpx::linear(x, w);
      const at::Tensor g = at::linspace(-1, 1, y[path].numel()).view(y[path].sizes()).to(c.dtype);
      y[path].backward(g);
      for (const at::Tensor& t : {x, w}) grads[path].push_back(t.grad());
    }
    const std::string what = std::string(c10::toString(c.dtype)) + " x " + c10::str(c.x_shape) +
                             (c.transposed_x ? " (non-contiguous)" : "");
    EXPECT_TRUE(y[1].equal(y[0])) << what;
    for (size_t i = 0; i < 2; ++i) {
      ASSERT_EQ(grads[1][i].defined(), grads[0][i].defined()) << what;
      if (grads[0][i].defined()) {
        EXPECT_TRUE(grads[1][i].equal(grads[0][i])) << what << ", gradient " << i;
      }
    }
  }
}

TEST(Linear, TakesTheKernelExactlyWhereAtMmAddsInItsOrder) {
  at::manual_seed(5);
  const at::Tensor a = at::randn({256, 256}).to(at::kBFloat16), b = at::randn({256, 256}).to(at::kBFloat16);
  at::Tensor probe_a = at::ones({4, 9}).to(at::kBFloat16), probe_b = at::ones({9, 8}).to(at::kBFloat16);
  probe_b[0].fill_(16777216.0);
  probe_b[4].fill_(-16777216.0);
  const bool mm_in_order =
      at::mm(a, b).equal(reference_loop(a, b)) && at::mm(probe_a, probe_b).equal(reference_loop(probe_a, probe_b));
  at::Tensor x = a.view({4, 64, 256}).detach().requires_grad_(true), w = b.detach().requires_grad_(true);
  fsdpx::linear(x, w).backward(at::randn({4, 64, 256}).to(at::kBFloat16));  // the input gradient is [256, 256] @ w
  EXPECT_EQ(linear_uses_bf16_kernel(), mm_in_order)
      << "this machine's at::mm " << (mm_in_order ? "adds" : "does not add") << " in the reference order";
}

}  // namespace
}  // namespace fsdpx
