// The time model's structure (fsdpx/framework/engine/step_time.h), on the memory plan's replay of
// a step with costs stated in the test: what a step without communication costs, what overlap
// hides and what it leaves exposed, what the shared cores expose, how micro-batches, recompute
// and the optimizer inside backward add up, and that no cost made larger makes the step shorter.
// No timing is measured here: benchmarks/plan_vs_measured.py compares the model with the clock.
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "fsdpx/framework/engine/memory_plan.h"

namespace {

using fsdpx::LayerActivations;
using fsdpx::LayerCost;
using fsdpx::StepCosts;
using fsdpx::StepMemoryInput;
using fsdpx::StepTime;
using fsdpx::UnitCost;
using fsdpx::UnitMemory;

UnitMemory unit(const std::string& fqn, std::vector<std::pair<std::string, int64_t>> params) {
  UnitMemory u;
  u.fqn = fqn;
  u.shard_numel = 1000;
  u.params = std::move(params);
  return u;
}

// A root (an embedding) and `n` units "layers.i" of two layers each (a and b, half of the unit's
// parameters each), `shard` ranks to a shard group: each unit's forward costs 1 s and its backward
// 2 s, as does the root's, each unit's all-gather `gather` s, its reduction `reduce` s, its
// optimizer step 0.25 s.
struct Model {
  StepMemoryInput in;
  StepCosts costs;
  Model(int n, int shard, double gather, double reduce) {
    in.layout.shard_group_size = shard;
    in.world_size = shard;
    in.units.push_back(unit("", {{"embed.weight", 1000}}));
    in.layers.push_back(LayerActivations{"embed", 10, 10, 0, 10});
    costs.layers.push_back(LayerCost{"embed", 1, 0, 2, 0});
    for (int i = 0; i < n; ++i) {
      const std::string path = "layers." + std::to_string(i);
      in.units.push_back(unit(path, {{path + ".a.weight", 500}, {path + ".b.weight", 500}}));
      for (const char* layer : {".a", ".b"}) {
        in.layers.push_back(LayerActivations{path + layer, 10, 10, 0, 10});
        costs.layers.push_back(LayerCost{path + layer, 0.25, 0.25, 0.75, 0.25});
      }
    }
    for (size_t u = 0; u < in.units.size(); ++u) {
      UnitCost c;
      c.gather = shard > 1 ? gather : 0;
      c.reduce = shard > 1 ? reduce : 0;
      c.optimizer = 0.25;
      costs.units.push_back(c);
    }
    in.costs = &costs;
  }
  double compute() const {
    double s = 0;
    for (const auto& l : costs.layers) s += l.forward_matmul + l.forward_memory + l.backward_matmul + l.backward_memory;
    return s;
  }
  StepTime run() const { return fsdpx::predict_step_memory(in).time; }
};

TEST(StepTime, WithoutCostsNothingIsPredicted) {
  Model m(3, 2, 0.1, 0.1);
  m.in.costs = nullptr;
  EXPECT_FALSE(m.run().predicted());
}

TEST(StepTime, AStepWithoutCommunicationIsItsComputeAndItsOptimizer) {
  const Model m(4, 1, 0, 0);
  const StepTime t = m.run();
  EXPECT_DOUBLE_EQ(t.forward, 1 + 4 * 1.0);
  EXPECT_DOUBLE_EQ(t.backward, 2 + 4 * 2.0);
  EXPECT_DOUBLE_EQ(t.optimizer, 5 * 0.25);
  EXPECT_DOUBLE_EQ(t.all_gather_wait + t.reduce_scatter_wait, 0);
  EXPECT_DOUBLE_EQ(t.step, m.compute() + 5 * 0.25);
  EXPECT_DOUBLE_EQ(t.matmul, 1 + 2 + 4 * 2 * (0.25 + 0.75));
  EXPECT_EQ(t.bound, "compute");
}

TEST(StepTime, OverlapLeavesOnlyTheGathersNothingIsPrefetchedBefore) {
  // Each gather and reduction (0.1 s) is shorter than a unit's compute (1 s forward, 2 s backward).
  // The engine prefetches after a unit's forward begins and once its backward has half of its
  // gradients: waited for are the root's gather and the first unit's (no unit's forward began
  // before them), the first unit's in backward, and the last reduction as the backward ends.
  const Model m(4, 2, 0.1, 0.1);
  const StepTime t = m.run();
  EXPECT_NEAR(t.all_gather_wait, 0.3, 1e-12);
  EXPECT_NEAR(t.reduce_scatter_wait, 0.1, 1e-12);
  // Units that reshard after forward gather again in backward: 5 gathers forward, 4 backward.
  EXPECT_NEAR(t.communication, (5 + 4) * 0.1 + 5 * 0.1, 1e-12);
  EXPECT_NEAR(t.step, m.compute() + 5 * 0.25 + 0.4, 1e-12);
}

TEST(StepTime, WithoutOverlapEveryGatherIsWaitedFor) {
  // Each of the 9 gathers, and in backward the 3 reductions issued just before a gather, which
  // the one communication stream runs first.
  Model m(4, 2, 0.1, 0.1);
  m.in.overlap = false;
  const StepTime t = m.run();
  EXPECT_NEAR(t.all_gather_wait, (5 + 4 + 3) * 0.1, 1e-12);
  EXPECT_GT(t.step, Model(4, 2, 0.1, 0.1).run().step);
}

TEST(StepTime, GathersLongerThanTheComputeAreExposedByTheDifference) {
  // A 3 s gather behind 1 s of forward per unit: the communication stream is the bound.
  const Model m(4, 2, 3, 0.1);
  const StepTime t = m.run();
  EXPECT_GT(t.all_gather_wait, 4 * (3 - 1.0) - 1e-9);
  EXPECT_EQ(t.bound, "communication");
  EXPECT_NEAR(t.step, t.forward + t.backward + t.all_gather_wait + t.reduce_scatter_wait + t.optimizer + t.other,
              1e-12);
}

TEST(StepTime, CommunicationOnTheComputeCoresIsExposedWhole) {
  Model m(4, 2, 0.1, 0.1);
  m.costs.communication_on_compute_cores = true;
  const StepTime t = m.run();
  EXPECT_NEAR(t.all_gather_wait + t.reduce_scatter_wait, t.communication, 1e-12);
  EXPECT_NEAR(t.step, m.compute() + 5 * 0.25 + t.communication, 1e-12);
}

TEST(StepTime, MicroBatchesRepeatTheirPassesAndReduceOnce) {
  Model one(3, 2, 0.1, 0.1), four(3, 2, 0.1, 0.1);
  four.in.forwards = 4;
  const StepTime a = one.run(), b = four.run();
  EXPECT_NEAR(b.forward, 4 * a.forward, 1e-12);
  EXPECT_NEAR(b.backward, 4 * a.backward, 1e-12);
  EXPECT_NEAR(b.optimizer, a.optimizer, 1e-12);  // one step for the four
  // The reductions run once, for the last micro-batch: 4 reductions' worth only in that pass.
  EXPECT_NEAR(b.communication - a.communication, 3 * (4 + 3) * 0.1, 1e-12);
}

TEST(StepTime, ARecomputedUnitRunsItsForwardAgainInBackward) {
  Model m(3, 1, 0, 0);
  m.in.units[2].recompute = true;
  const StepTime t = m.run(), plain = Model(3, 1, 0, 0).run();
  EXPECT_DOUBLE_EQ(t.recompute, 1.0);
  EXPECT_DOUBLE_EQ(t.backward, plain.backward + 1.0);
  EXPECT_DOUBLE_EQ(t.forward, plain.forward);
}

TEST(StepTime, TheOptimizerInsideBackwardStepsEachUnitOnce) {
  Model m(3, 2, 0.1, 0.1);
  m.in.step_in_backward = true;
  const StepTime t = m.run(), after = Model(3, 2, 0.1, 0.1).run();
  EXPECT_DOUBLE_EQ(t.optimizer, 0);
  EXPECT_NEAR(t.step, after.step, 1e-9);  // the same work, here inside backward
  EXPECT_NEAR(t.backward, after.backward + after.optimizer, 1e-9);
}

TEST(StepTime, NoCostMadeLargerMakesTheStepShorter) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0, 2);
  for (int trial = 0; trial < 200; ++trial) {
    Model m(4, 2, cost(rng), cost(rng));
    m.in.overlap = trial % 3 != 0;
    m.costs.communication_on_compute_cores = trial % 5 == 0;
    m.in.units[1 + trial % 4].recompute = trial % 2 == 0;
    for (auto& u : m.costs.units) u.copy_out = cost(rng) / 10;
    const double before = m.run().step;
    Model more = m;
    more.in.costs = &more.costs;
    switch (trial % 4) {
      case 0:
        more.costs.layers[static_cast<size_t>(trial) % more.costs.layers.size()].forward_matmul += cost(rng);
        break;
      case 1: more.costs.units[static_cast<size_t>(trial) % more.costs.units.size()].gather += cost(rng); break;
      case 2: more.costs.units[static_cast<size_t>(trial) % more.costs.units.size()].reduce += cost(rng); break;
      default: more.costs.layers[static_cast<size_t>(trial) % more.costs.layers.size()].backward_memory += cost(rng);
    }
    EXPECT_GE(more.run().step, before - 1e-12) << "trial " << trial;
  }
}

}  // namespace
