// The out-of-tree example plugin (built by the sdk_consumer_build test against the installed
// SDK) loads through the host, and its component works on a real module tree.
#include <cstdlib>

#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/engine/unit_plan.h"

namespace fsdpx {
namespace {

TEST(SdkExample, LoadsThroughTheHostAndSelectsUnits) {
  const char* path = std::getenv("FSDPX_TEST_EXAMPLE_PLUGIN");
  ASSERT_NE(path, nullptr) << "FSDPX_TEST_EXAMPLE_PLUGIN is not set; run through ctest";
  PluginHost host;
  host.load_file(path);
  ASSERT_EQ(host.plugins().size(), 1u);
  EXPECT_EQ(host.plugins()[0]->name, "example_top_level_wrap");
  EXPECT_EQ(host.plugins()[0]->torch_version, "2.11.0");
  auto policy = host.create<WrapPolicy>("top_level", {{"min_num_params", "10"}});
  torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::Linear(2, 2), torch::nn::Linear(4, 1));
  UnitPlan plan = plan_units(*model, policy->select(*model));
  ASSERT_EQ(plan.units.size(), 2u);  // Linear(4,4) has 20; Linear(2,2) 6 and Linear(4,1) 5 stay with the root
  EXPECT_EQ(plan.units[1].fqn, "0");
  EXPECT_EQ(plan.units[0].num_params, 11);
}

}  // namespace
}  // namespace fsdpx
