// The out-of-tree example plugins (built by the sdk_consumer_build test against the installed
// SDK) load through the host, and their components work: the wrap policy on a real module tree,
// the data source on the SDK's sampler at several world sizes.
#include <cstdlib>
#include <map>
#include <set>
#include <vector>

#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/data_source.h"

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

// Each step's global batch (the union of the ranks' first tokens, which are the sample indices)
// is the same at 1, 2 and 3 ranks, and a restored position reads on where the saved one would.
TEST(SdkExample, CountingDataReadsTheSameGlobalBatchesAtEveryWorldSize) {
  const char* path = std::getenv("FSDPX_TEST_COUNTING_PLUGIN");
  ASSERT_NE(path, nullptr) << "FSDPX_TEST_COUNTING_PLUGIN is not set; run through ctest";
  PluginHost host;
  host.load_file(path);
  const std::map<std::string, std::string> options{{"samples", "30"}, {"seq", "4"}};
  auto global_batches = [&](int world) {
    std::vector<std::set<int64_t>> steps(3);
    for (int rank = 0; rank < world; ++rank) {
      auto data = host.create<DataSource>("counting", options);
      data->open(DataContext{rank, world, 6 / world, 7});
      for (auto& step : steps) {
        const Batch b = data->next();
        EXPECT_EQ(b.inputs.size(1), 4);
        for (int64_t i = 0; i < b.inputs.size(0); ++i) step.insert(b.inputs[i][0].item<int64_t>());
      }
    }
    return steps;
  };
  const auto one = global_batches(1);
  for (const auto& step : one) EXPECT_EQ(step.size(), 6u);
  EXPECT_EQ(global_batches(2), one);
  EXPECT_EQ(global_batches(3), one);

  auto saved = host.create<DataSource>("counting", options), resumed = host.create<DataSource>("counting", options);
  saved->open(DataContext{0, 1, 6, 7});
  resumed->open(DataContext{0, 1, 6, 7});
  saved->next();
  resumed->restore(saved->state());
  EXPECT_TRUE(at::equal(resumed->next().inputs, saved->next().inputs));
}

}  // namespace
}  // namespace fsdpx
