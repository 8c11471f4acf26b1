// The size_based wrap policy on real torch::nn module trees, checked through the unit plan.
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/unit.h"
#include "test_paths.h"

namespace fsdpx {
namespace {

// Wrappable layers (FSDPX_MODULE), shaped like torch::nn's.
struct LinImpl : torch::nn::Module {
  LinImpl(int64_t in, int64_t out) : torch::nn::Module("Lin") {
    weight = register_parameter("weight", at::ones({out, in}));
    bias = register_parameter("bias", at::ones({out}));
  }
  at::Tensor forward(const at::Tensor& x) { return x.matmul(weight.t()) + bias; }
  at::Tensor weight, bias;
};
FSDPX_MODULE(Lin);

struct EmbImpl : torch::nn::Module {
  EmbImpl(int64_t vocab, int64_t d) : torch::nn::Module("Emb") {
    weight = register_parameter("weight", at::ones({vocab, d}));
  }
  at::Tensor forward(const at::Tensor& x) { return weight.index_select(0, x); }
  at::Tensor weight;
};
FSDPX_MODULE(Emb);

struct TiedImpl : torch::nn::Module {
  explicit TiedImpl(at::Tensor t) : torch::nn::Module("Tied") { weight = register_parameter("weight", t); }
  at::Tensor forward(const at::Tensor& x) { return x.matmul(weight); }
  at::Tensor weight;
};
FSDPX_MODULE(Tied);

// A small transformer-shaped tree: embedding, 3 blocks of two linears, a head.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d) : torch::nn::Module("Block") {
    up = register_module("up", Lin(d, 4 * d));    // 4d^2 + 4d
    down = register_module("down", Lin(4 * d, d));  // 4d^2 + d
  }
  at::Tensor forward(const at::Tensor& x) { return down(up(x)); }
  Lin up{nullptr}, down{nullptr};
};
FSDPX_MODULE(Block);

struct Net : torch::nn::Module {
  Net(int64_t vocab, int64_t d, int n) {
    embed = register_module("embed", Emb(vocab, d));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < n; ++i) blocks->push_back(Block(d));
    head = register_module("head", Lin(d, vocab));
  }
  Emb embed{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  Lin head{nullptr};
};

class SizeBasedTest : public ::testing::Test {
 protected:
  void SetUp() override { host.load_file(test::plugin_dir() / "wrap_size_based.so"); }
  UnitPlan plan(const torch::nn::Module& m, int64_t min) {
    auto policy = host.create<WrapPolicy>("size_based", {{"min_num_params", std::to_string(min)}});
    return plan_units(m, policy->select(m));
  }
  PluginHost host;
};

TEST_F(SizeBasedTest, WrapsEachBlockWhenABlockReachesTheThreshold) {
  Net net(100, 8, 3);  // block = 4*64+32 + 4*64+8 = 552; embed 800; head 900
  UnitPlan p = plan(net, 552);
  std::vector<std::string> fqns;
  for (const auto& u : p.units) fqns.push_back(u.fqn);
  // Linears alone (288, 264) are below the threshold; each block reaches it; the block list
  // then holds nothing new; embed and head are large enough on their own.
  EXPECT_EQ(fqns, (std::vector<std::string>{"", "embed", "blocks.0", "blocks.1", "blocks.2", "head"}));
  EXPECT_EQ(p.units[0].num_params, 0);
  EXPECT_EQ(p.units[2].num_params, 552);
  EXPECT_EQ(p.units[2].num_tensors, 4);
  EXPECT_EQ(p.total_params, 800 + 3 * 552 + 900);
}

TEST_F(SizeBasedTest, SmallLeftoversStayWithTheRoot) {
  Net net(100, 8, 3);
  UnitPlan p = plan(net, 850);
  // No single block reaches 850; the block list (1656) cannot be hooked, so it is never a unit
  // (PyTorch excludes ModuleList too); the blocks and the embedding (800) stay with the root; the
  // head (900) is a unit.
  ASSERT_EQ(p.units.size(), 2u);
  EXPECT_EQ(p.units[0].fqn, "");
  EXPECT_EQ(p.units[0].num_params, 800 + 1656);
  EXPECT_EQ(p.units[1].fqn, "head");
}

TEST_F(SizeBasedTest, NestedUnitsTakeTheirOwnParameters) {
  Net net(100, 8, 3);
  UnitPlan p = plan(net, 288);  // each `up` (288) is a unit; each block's rest (264) is not
  std::vector<std::string> fqns;
  for (const auto& u : p.units) fqns.push_back(u.fqn);
  // What the `up`s leave (three `down`s, 264 each) passes through the block list, a container,
  // to the root.
  EXPECT_EQ(fqns, (std::vector<std::string>{"", "embed", "blocks.0.up", "blocks.1.up", "blocks.2.up", "head"}));
  EXPECT_EQ(p.units[0].num_params, 3 * 264);
  int64_t sum = 0;
  for (const auto& u : p.units) sum += u.num_params;
  EXPECT_EQ(sum, p.total_params);  // every parameter belongs to exactly one unit
}

TEST_F(SizeBasedTest, ThresholdAboveEverySubmoduleIsAnError) {
  Net net(100, 8, 3);
  try {
    plan(net, 100000000);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "size_based selected no unit: no wrappable layer holds min_num_params=100000000 "
                           "parameters (the largest holds 900); lower min_num_params");
  }
}

TEST_F(SizeBasedTest, PlanTableShowsUnitsAndRatio) {
  Net net(100, 8, 3);
  UnitPlan p = plan(net, 552);
  EXPECT_NE(p.table().find("6 units, 3356 parameters; largest/smallest unit = 1.63"), std::string::npos) << p.table();
}

TEST_F(SizeBasedTest, SharedParametersAreCountedOnce) {
  // One tensor registered under two layers, as tied embeddings are.
  Tied a(at::ones({50, 4}));
  Tied b(a->weight);
  torch::nn::Module root;
  root.register_module("a", a.ptr());
  root.register_module("b", b.ptr());
  UnitPlan p = plan(root, 150);
  EXPECT_EQ(p.total_params, 200);
  ASSERT_EQ(p.units.size(), 2u);  // `a` reaches 150 and takes the tensor; `b` has nothing new
  EXPECT_EQ(p.units[1].fqn, "a");
  EXPECT_EQ(p.units[1].num_params, 200);
}

TEST_F(SizeBasedTest, LayersFsdpxCannotHookAreNeverUnits) {
  // A plain torch::nn::Linear of 900 parameters: its parameters go to the nearest wrappable
  // layer above it (here the root), whatever their number.
  torch::nn::Module root;
  root.register_module("plain", torch::nn::Linear(8, 100));
  root.register_module("head", Lin(8, 100));
  UnitPlan p = plan(root, 500);
  ASSERT_EQ(p.units.size(), 2u);
  EXPECT_EQ(p.units[0].num_params, 900);
  EXPECT_EQ(p.units[1].fqn, "head");
}

TEST(UnitPlan, RejectsNamesThatAreNotSubmodules) {
  torch::nn::Sequential model(torch::nn::Linear(2, 2));
  try {
    plan_units(*model, {{"1", false}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "the wrap policy selected '1', which is not a submodule of the model; did you mean '0'?");
  }
}

}  // namespace
}  // namespace fsdpx
