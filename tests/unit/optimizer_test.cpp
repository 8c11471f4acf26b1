// The optimizer plugins: numerics against LibTorch's own optimizers, AnyPrecision's reason to
// exist (Kahan summation in bf16), state bytes, and bad options.
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/optimizer.h"
#include "test_paths.h"

namespace fsdpx {
namespace {

class OptimizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* p : {"optimizer_adamw", "optimizer_anyprecision_adamw", "optimizer_sgd"})
      host.load_file(test::plugin_dir() / (std::string(p) + ".so"));
  }
  PluginHost host;
};

// Runs `ours` and `theirs` (a torch::optim optimizer) on copies of the same parameters with the
// same gradients for `steps` steps; returns the largest difference.
double max_diff(Optimizer& ours, torch::optim::Optimizer& theirs, std::vector<at::Tensor>& a,
                std::vector<at::Tensor>& b, int steps, double lr) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < a.size(); ++i) {
      at::Tensor g = at::randn(a[i].sizes(), gen);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    ours.step(lr);
    theirs.step();
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  }
  return worst;
}

std::vector<at::Tensor> params(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> out;
  for (auto shape : {std::vector<int64_t>{7, 5}, std::vector<int64_t>{13}})
    out.push_back(at::randn(shape, gen).requires_grad_(true));
  return out;
}

std::vector<ParamShard> named(const std::vector<at::Tensor>& ps) {
  std::vector<ParamShard> out;
  for (size_t i = 0; i < ps.size(); ++i) out.push_back({"p" + std::to_string(i), ps[i]});
  return out;
}

// fp32 tolerance: the same formula in the same order gives the same floats up to the rounding
// of sqrt and the bias-correction constants (computed in double here, in float there): ~1e-7
// per step, 20 steps.
constexpr double kTol = 2e-6;

TEST_F(OptimizerTest, AdamWMatchesTorchAdamW) {
  for (std::string name : {"adamw", "anyprecision_adamw"}) {
    std::map<std::string, std::string> opts = {
        {"lr", "0.01"}, {"betas", "0.8,0.95"}, {"eps", "1e-6"}, {"weight_decay", "0.1"}};
    if (name == "anyprecision_adamw") opts["variance_dtype"] = "fp32";  // fp32 moments, Kahan off
    auto ours = host.create<Optimizer>(name, opts);
    auto a = params(1), b = params(1);
    ours->init(named(a));
    torch::optim::AdamW theirs(b, torch::optim::AdamWOptions(0.01).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1));
    const double d = max_diff(*ours, theirs, a, b, 20, 0.01);
    EXPECT_LT(d, kTol) << name;
    std::printf("%s vs torch::optim::AdamW, 20 steps: max |diff| %.3g\n", name.c_str(), d);
  }
}

TEST_F(OptimizerTest, SgdMatchesTorchSgd) {
  auto ours = host.create<Optimizer>(
      "sgd", std::map<std::string, std::string>{
                 {"lr", "0.05"}, {"momentum", "0.9"}, {"nesterov", "true"}, {"weight_decay", "0.01"}});
  auto a = params(2), b = params(2);
  ours->init(named(a));
  torch::optim::SGD theirs(b, torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(0.01));
  EXPECT_LT(max_diff(*ours, theirs, a, b, 20, 0.05), kTol);
}

TEST_F(OptimizerTest, KahanKeepsSmallUpdatesThatBf16Swallows) {
  // 2000 steps of lr 1e-4 on weights near 1, where bf16's spacing is 2^-7 = 0.0078: every
  // single update is below half a spacing, so plain bf16 never moves. Reference: the same
  // optimizer on fp32 weights with fp32 moments.
  const int steps = 2000;
  auto run = [&](at::ScalarType dtype, bool kahan) {
    // fp32 variance in every run: the error measured is the weights' rounding, which Kahan is
    // for, not the bias of a bf16 variance (its updates of 0.1% of v round away in 8 bits).
    std::map<std::string, std::string> o = {
        {"lr", "1e-4"}, {"use_kahan_summation", kahan ? "true" : "false"}, {"variance_dtype", "fp32"}};
    auto opt = host.create<Optimizer>("anyprecision_adamw", o);
    at::Tensor w = at::full({64}, 1.0, at::kFloat).to(dtype).requires_grad_(true);
    opt->init({{"w", w}});
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    for (int s = 0; s < steps; ++s) {
      w.mutable_grad() = (at::randn({64}, gen) * 0.1 + 1.0).to(dtype);  // mostly positive: w drifts down
      opt->step(1e-4);
    }
    return w.detach().to(at::kFloat);
  };
  at::Tensor ref = run(at::kFloat, false);
  const double err_plain = (run(at::kBFloat16, false) - ref).abs().mean().item<double>();
  const double err_kahan = (run(at::kBFloat16, true) - ref).abs().mean().item<double>();
  std::printf("pure bf16 after %d steps: mean |error| vs fp32 %.5f without Kahan, %.5f with Kahan (ratio %.1f)\n",
              steps, err_plain, err_kahan, err_plain / err_kahan);
  // Plain bf16: about lr x steps, nothing moved. Kahan: the residue of a bf16 compensation
  // buffer (8 significant bits; the default, as in torchdistx): observed 0.0003, 690x closer.
  EXPECT_GT(err_plain, 0.1);
  EXPECT_GT(err_plain / err_kahan, 100.0);
}

// AnyPrecision's single pass over contiguous CPU shards (update_kernel.cpp) and its tensor-op
// form (taken for anything else: here a non-contiguous parameter) are the same update: both
// compute in fp32 and round into fp32 here, so they differ only where the fused pass keeps an
// intermediate unrounded (a few ulps of the update, ~1e-9 at lr 0.01), over 20 steps.
TEST_F(OptimizerTest, AnyPrecisionSinglePassEqualsTheTensorOps) {
  std::map<std::string, std::string> o = {{"lr", "0.01"}, {"variance_dtype", "fp32"}, {"weight_decay", "0.1"}};
  auto fused = host.create<Optimizer>("anyprecision_adamw", o), ops = host.create<Optimizer>("anyprecision_adamw", o);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor base = at::randn({70, 37}, gen);  // 2590 elements: several 512-element blocks and a remainder
  at::Tensor a = base.clone().requires_grad_(true);
  at::Tensor b = base.t().contiguous().t().requires_grad_(true);  // the same values, column-major
  ASSERT_FALSE(b.is_contiguous());
  fused->init({{"w", a}});
  ops->init({{"w", b}});
  double worst = 0;
  for (int s = 0; s < 20; ++s) {
    at::Tensor g = at::randn({70, 37}, gen);
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.t().contiguous().t();
    fused->step(0.01);
    ops->step(0.01);
    worst = std::max(worst, (a - b).abs().max().item<double>());
  }
  std::printf("single pass vs tensor ops, 20 steps: max |diff| %.3g\n", worst);
  EXPECT_LT(worst, 1e-6);
}

// Low-precision moments move the result by about their rounding: per step the update (~lr, Adam
// normalises it) is off by at most a few units of the moment dtype's epsilon, and the fp32
// weights (|w| < 5) round differently by up to an ulp of 4 (4.8e-7): 20 steps stay within
// 20 x (lr x 4 eps + 4.8e-7) of fp32 moments. fp64 moments (computed in fp64) add no epsilon term.
TEST_F(OptimizerTest, AnyPrecisionMomentDtypesStayWithinTheirRounding) {
  auto run = [&](const std::string& dtype) {
    auto opt = host.create<Optimizer>(
        "anyprecision_adamw",
        std::map<std::string, std::string>{{"lr", "0.01"}, {"momentum_dtype", dtype}, {"variance_dtype", dtype}});
    auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
    at::Tensor w = at::randn({3000}, gen).requires_grad_(true);
    opt->init({{"w", w}});
    for (int s = 0; s < 20; ++s) {
      w.mutable_grad() = at::randn({3000}, gen);
      opt->step(0.01);
    }
    return w.detach();
  };
  const at::Tensor ref = run("fp32");
  for (auto [dtype, eps] : {std::pair<const char*, double>{"fp64", 0.0}, {"fp16", 9.8e-4}, {"bf16", 7.8e-3}}) {
    const double d = (run(dtype) - ref).abs().max().item<double>(), bound = 20 * (0.01 * 4 * eps + 4.8e-7);
    std::printf("moments in %s vs fp32, 20 steps: max |diff| %.3g (bound %.3g)\n", dtype, d, bound);
    EXPECT_LT(d, bound) << dtype;
    EXPECT_GT(d, 0.0) << dtype << " moments gave fp32's bits exactly: were they kept in fp32?";
  }
}

TEST_F(OptimizerTest, StateBytesPerParameter) {
  auto bytes = [&](const std::string& name, std::map<std::string, std::string> o, at::ScalarType dtype) {
    auto opt = host.create<Optimizer>(name, o);
    at::Tensor w = at::zeros({1000}, dtype).requires_grad_(true);
    opt->init({{"w", w}});
    int64_t total = 0;
    for (const auto& [key, t] : opt->state("w"))
      if (t.dim() > 0) total += t.numel() * t.element_size();  // the scalar step is not per parameter
    return total / 1000.0;
  };
  EXPECT_EQ(bytes("adamw", {}, at::kFloat), 8.0);
  EXPECT_EQ(bytes("anyprecision_adamw", {}, at::kFloat), 6.0);  // fp32 momentum + bf16 variance
  EXPECT_EQ(bytes("anyprecision_adamw", {{"use_kahan_summation", "true"}}, at::kBFloat16), 8.0);  // + bf16 compensation
  EXPECT_EQ(bytes("sgd", {{"momentum", "0.9"}}, at::kFloat), 4.0);  // the buffer exists from init (checkpoints need it)
  EXPECT_EQ(bytes("sgd", {}, at::kFloat), 0.0);                     // no momentum, no state
}

TEST_F(OptimizerTest, BadOptionsAreClearErrors) {
  EXPECT_EQ(test::error_of([&] { host.create<Optimizer>("anyprecision_adamw", {{"momentum_dtype", "fp8"}}); }),
            "optimizer 'anyprecision_adamw' (plugin optimizer_anyprecision_adamw): option optimizer.momentum_dtype "
            "expects one of fp32, bf16, fp16, fp64, got 'fp8'; did you mean 'fp32'?");
  EXPECT_EQ(test::error_of([&] { host.create<Optimizer>("adamw", {{"lr", "-1"}}); }),
            "optimizer 'adamw' (plugin optimizer_adamw): option optimizer.lr expects a number greater than 0, "
            "got '-1'");
  EXPECT_EQ(test::error_of([&] { host.create<Optimizer>("adamw", {{"betas", "0.9,1.0"}}); }),
            "optimizer 'adamw' (plugin optimizer_adamw): betas must be two numbers in [0, 1), got '1.0'");
  EXPECT_EQ(test::error_of([&] { host.create<Optimizer>("sgd", {{"nesterov", "true"}}); }),
            "optimizer 'sgd' (plugin optimizer_sgd): nesterov needs momentum > 0 and dampening 0");
  auto kahan = host.create<Optimizer>("anyprecision_adamw", {{"use_kahan_summation", "true"}});
  at::Tensor w = at::zeros({4}).requires_grad_(true);
  EXPECT_EQ(test::error_of([&] { kahan->init({{"w", w}}); }),
            "use_kahan_summation is for low-precision parameters, but 'w' is fp32, where it has no effect but its "
            "cost; turn it off, or keep bf16 parameters (precision pure_bf16)");
}

}  // namespace
}  // namespace fsdpx
