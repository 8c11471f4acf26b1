// fsdpx/float8.h: the scale and the cast are torchao's rule (checked against the rule worked out
// here in double arithmetic), the three products are the scaled products of the casts (checked
// against the dequantized casts multiplied in fp32), their error against the exact product is
// float8's, and fsdpx::linear computes in float8 exactly inside a Float8Scope and for the weights
// float8_eligible accepts. Bitwise agreement with torchao itself is benchmarks/vs_fsdp2's test
// (VsFsdp2.Float8EqualsFsdp2WithTorchaosFloat8).
#include <cmath>
#include <limits>

#include <ATen/ops/_scaled_mm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "fsdpx/error.h"
#include "fsdpx/float8.h"
#include "fsdpx/linear.h"

namespace fsdpx {
namespace {

// torchao's amax_to_scale: in float64, max(format) / max(amax, 1e-12), then rounded to float32.
float expected_scale(const at::Tensor& t, double format_max) {
  const double amax = std::max(t.abs().max().item<double>(), 1e-12);
  return static_cast<float>((1.0 / amax) * format_max);
}

// The cast as a reader would dequantize it: each element times 1 / scale, in fp32.
at::Tensor dequantized(const at::Tensor& t8, const at::Tensor& scale) { return t8.to(at::kFloat) / scale; }

TEST(Float8, ScalesFollowTorchaosAmaxRule) {
  at::manual_seed(3);
  for (const double spread : {1e-3, 1.0, 300.0}) {
    const at::Tensor t = at::randn({37, 19}) * spread;
    EXPECT_EQ(float8_scale(t, at::kFloat8_e4m3fn).item<float>(), expected_scale(t, kFloat8E4m3Max)) << spread;
    EXPECT_EQ(float8_scale(t, at::kFloat8_e5m2).item<float>(), expected_scale(t, kFloat8E5m2Max)) << spread;
    EXPECT_EQ(float8_scale(t.to(at::kBFloat16), at::kFloat8_e4m3fn).item<float>(),
              expected_scale(t.to(at::kBFloat16).to(at::kFloat), kFloat8E4m3Max));
  }
  const at::Tensor zero = float8_scale(at::zeros({4, 4}), at::kFloat8_e4m3fn);
  EXPECT_TRUE(std::isfinite(zero.item<float>()));  // all zeros: a finite scale, zeros out
  EXPECT_EQ(zero.scalar_type(), at::kFloat);
  EXPECT_EQ(zero.dim(), 0);
  EXPECT_THROW(float8_scale(at::zeros({2}), at::kHalf), Error);
}

TEST(Float8, CastsSaturateRoundAndKeepTheLayout) {
  const at::Tensor one = at::ones({}, at::kFloat);
  const at::Tensor big = at::tensor({1000.0f, -1000.0f, 448.0f, 1.0f, 0.0f, 1.0625f});
  const at::Tensor e4m3 = to_float8(big, one, at::kFloat8_e4m3fn).to(at::kFloat);
  // Saturated at +-448 (not NaN); 1.0625 is halfway between e4m3's 1 and 1.125: to even, 1.
  EXPECT_TRUE(e4m3.equal(at::tensor({448.0f, -448.0f, 448.0f, 1.0f, 0.0f, 1.0f}))) << e4m3;
  const at::Tensor e5m2 = to_float8(big * 100, one, at::kFloat8_e5m2).to(at::kFloat);
  EXPECT_EQ(e5m2[0].item<float>(), 57344.0f);  // 100000 saturates at e5m2's largest
  const at::Tensor w = at::randn({32, 48}).t();  // a column-major view
  const at::Tensor w8 = to_float8(w, float8_scale(w, at::kFloat8_e4m3fn), at::kFloat8_e4m3fn);
  EXPECT_EQ(w8.strides(), w.strides());
  EXPECT_EQ(w8.scalar_type(), at::kFloat8_e4m3fn);
}

struct Operands {
  at::Tensor x, w, g;
};

Operands operands(at::ScalarType dtype) {
  at::manual_seed(11);
  return {at::randn({2, 24, 64}).to(dtype).requires_grad_(), (at::randn({48, 64}) * 0.1).to(dtype).requires_grad_(),
          (at::randn({2, 24, 48}) * 1e-3).to(dtype)};
}

// |a - b| / |b| over the whole tensor.
double relative(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kFloat) - b.to(at::kFloat)).norm() / b.to(at::kFloat).norm()).item<double>();
}

TEST(Float8, ProductsAreTheScaledProductsOfTheCasts) {
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const Operands o = operands(dtype);
    const at::Tensor y = float8_linear(o.x, o.w);
    ASSERT_EQ(y.scalar_type(), dtype);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 24, 48}));
    const auto grads = torch::autograd::grad({y}, {o.x, o.w}, {o.g});

    const at::Tensor sx = float8_scale(o.x, at::kFloat8_e4m3fn), sw = float8_scale(o.w, at::kFloat8_e4m3fn);
    const at::Tensor sg = float8_scale(o.g, at::kFloat8_e5m2);
    const at::Tensor x = dequantized(to_float8(o.x.detach(), sx, at::kFloat8_e4m3fn), sx).reshape({-1, 64});
    const at::Tensor w = dequantized(to_float8(o.w.detach(), sw, at::kFloat8_e4m3fn), sw);
    const at::Tensor g = dequantized(to_float8(o.g, sg, at::kFloat8_e5m2), sg).reshape({-1, 48});
    // The scaled product adds in fp32 and rounds once to the output dtype: within that rounding.
    const double tol = dtype == at::kFloat ? 1e-6 : 8e-3;
    EXPECT_LT(relative(y.reshape({-1, 48}), x.mm(w.t())), tol) << dtype;
    EXPECT_LT(relative(grads[0].reshape({-1, 64}), g.mm(w)), tol) << dtype;
    EXPECT_LT(relative(grads[1], g.t().mm(x)), tol) << dtype;

    // Against the exact product: e4m3 keeps 3 bits of mantissa (a relative step of 1/16, an
    // error of at most 1/32 per element, about 1/32/sqrt(3) on average), e5m2 two (1/8, 1/8/sqrt(3)).
    const at::Tensor xf = o.x.detach().to(at::kFloat).reshape({-1, 64}), wf = o.w.detach().to(at::kFloat);
    const at::Tensor gf = o.g.to(at::kFloat).reshape({-1, 48});
    const double y_err = relative(y.reshape({-1, 48}), xf.mm(wf.t()));
    EXPECT_LT(y_err, 0.05) << dtype;
    EXPECT_GT(y_err, 1e-3) << dtype;  // and it did compute in float8
    EXPECT_LT(relative(grads[0].reshape({-1, 64}), gf.mm(wf)), 0.15) << dtype;
    EXPECT_LT(relative(grads[1], gf.t().mm(xf)), 0.15) << dtype;
  }
}

TEST(Float8, FsdpxLinearComputesInFloat8InsideAScopeAndForEligibleWeightsOnly) {
  const Operands o = operands(at::kBFloat16);
  const at::Tensor plain = at::linear(o.x, o.w), eight = float8_linear(o.x, o.w);
  ASSERT_FALSE(plain.equal(eight));
  EXPECT_FALSE(float8_on());
  EXPECT_TRUE(fsdpx::linear(o.x, o.w).equal(plain));
  const uint64_t before = float8_linears_computed();
  {
    Float8Scope on(true);
    EXPECT_TRUE(float8_on());
    EXPECT_TRUE(fsdpx::linear(o.x, o.w).equal(eight));
    EXPECT_TRUE(output_linear(o.x, o.w).equal(plain));  // the output projection: never float8
    EXPECT_TRUE(float8_on());                           // and float8 is back on after it
    const at::Tensor odd = at::randn({40, 64}).to(at::kBFloat16);  // 40: not a multiple of 16
    EXPECT_FALSE(float8_eligible(odd));
    EXPECT_TRUE(fsdpx::linear(o.x, odd).equal(at::linear(o.x, odd)));
    {
      Float8Scope off(false);  // a unit inside that computes in bf16
      EXPECT_TRUE(fsdpx::linear(o.x, o.w).equal(plain));
    }
    EXPECT_TRUE(float8_on());
  }
  EXPECT_FALSE(float8_on());
  EXPECT_EQ(float8_linears_computed(), before + 1);
  EXPECT_TRUE(float8_eligible(o.w));
  EXPECT_FALSE(float8_eligible(at::randn({16})));
  EXPECT_FALSE(float8_eligible(at::zeros({16, 16}, at::kLong)));
}

TEST(Float8, ShapesItCannotTakeAreNamed) {
  try {
    float8_linear(at::randn({4, 24}), at::randn({16, 24}));
    FAIL() << "a weight of 24 columns was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("both sizes multiples of 16; got x [4, 24] and weight [16, 24]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(float8_linear(at::randn({4, 32}), at::randn({16, 48})), Error);  // in != 32
}

}  // namespace
}  // namespace fsdpx
