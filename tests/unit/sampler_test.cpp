// GlobalBatchSampler: disjoint, complete coverage over the ranks at world sizes 1 to 4; the same
// global batches at every world size; deterministic shuffles; resumable positions.
#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include "fsdpx/sampler.h"
#include "test_paths.h"

namespace fsdpx {
namespace {

TEST(Sampler, DisjointCompleteAndTheSameGlobalBatchAtEveryWorldSize) {
  const int64_t n = 100, global = 12, steps = 3 * (n / global);  // three epochs
  std::vector<std::vector<std::set<int64_t>>> batches(5);        // [world][step] -> union over ranks
  for (int w = 1; w <= 4; ++w) {
    std::vector<GlobalBatchSampler> ranks;
    for (int r = 0; r < w; ++r) ranks.emplace_back(n, global, r, w, /*seed=*/42);
    std::set<int64_t> epoch_seen;
    for (int64_t s = 0; s < steps; ++s) {
      std::set<int64_t> all;
      size_t count = 0;
      for (auto& rank : ranks) {
        auto mine = rank.next();
        EXPECT_EQ(mine.size(), static_cast<size_t>(global / w));
        count += mine.size();
        all.insert(mine.begin(), mine.end());
      }
      EXPECT_EQ(all.size(), count) << "ranks overlap at step " << s << ", world " << w;
      EXPECT_EQ(count, static_cast<size_t>(global));
      for (int64_t i : all) EXPECT_TRUE(epoch_seen.insert(i).second) << "sample " << i << " twice in one epoch";
      if ((s + 1) % (n / global) == 0) {
        EXPECT_EQ(epoch_seen.size(), static_cast<size_t>(n / global * global));  // every full batch's samples once
        epoch_seen.clear();
      }
      batches[w].push_back(all);
    }
  }
  for (int w = 2; w <= 4; ++w) EXPECT_EQ(batches[w], batches[1]) << "world " << w << " sees other global batches";
  EXPECT_NE(batches[1][0], batches[1][n / global]) << "epochs are shuffled differently";
}

TEST(Sampler, SeedAndPositionDecideEverything) {
  GlobalBatchSampler a(50, 8, 1, 2, 7), b(50, 8, 1, 2, 7), c(50, 8, 1, 2, 8);
  EXPECT_EQ(a.next(), b.next());
  EXPECT_NE(b.next(), c.next());
  // Resume: a fresh sampler restored to a's position continues exactly like a.
  for (int i = 0; i < 9; ++i) a.next();  // crosses into the second epoch
  GlobalBatchSampler resumed(50, 8, 1, 2, 7);
  resumed.restore(a.state());
  EXPECT_EQ(a.state(), "{\"epoch\":1,\"step\":4}");
  for (int i = 0; i < 10; ++i) EXPECT_EQ(resumed.next(), a.next());
}

TEST(Sampler, BadInput) {
  EXPECT_EQ(test::error_of([] { GlobalBatchSampler(100, 10, 0, 4, 1); }),
            "the global batch of 10 samples does not split evenly over 4 ranks; use a batch size per rank "
            "(--batch-size) instead");
  EXPECT_EQ(test::error_of([] { GlobalBatchSampler(10, 16, 0, 2, 1); }),
            "the global batch (16 samples: batch size per rank x 2 ranks) is larger than the data set (10 "
            "samples); lower --batch-size or use more data");
  GlobalBatchSampler s(10, 2, 0, 1, 1);
  EXPECT_EQ(test::error_of([&] { s.restore("{\"epoch\":0,\"step\":99}"); }),
            "data position {\"epoch\":0,\"step\":99} is outside this data set (5 steps per epoch)");
}

// SplitSamples: one split from its seed alone (training and held-out samples disjoint, all of them
// together), training batches drawn from the training samples only, and one-line errors.
TEST(SplitSamples, HeldOutApartFromTrainingAndTheSameForEverySeedOfTheRun) {
  SplitSamples a(50, 0.2, /*split_seed=*/7, "pairs"), b(50, 0.2, 7, "pairs");
  EXPECT_EQ(a.training(), 40);
  EXPECT_EQ(a.held_out(), 10);
  const std::vector<int64_t> held = a.heldout(0, 10);
  EXPECT_EQ(held, b.heldout(0, 10));
  std::set<int64_t> training;
  for (int64_t t = 0; t < a.training(); ++t) training.insert(a.training_sample(t));
  std::set<int64_t> all(training);
  all.insert(held.begin(), held.end());
  EXPECT_EQ(all.size(), 50u);
  a.open(/*batch_size=*/4, /*rank=*/0, /*world_size=*/2, /*seed=*/1);
  for (int step = 0; step < 20; ++step)
    for (int64_t i : a.next()) EXPECT_TRUE(training.count(i)) << "sample " << i << " is held out";
  EXPECT_NE(SplitSamples(50, 0.2, 8, "pairs").heldout(0, 10), held);  // another split seed, another split
  SplitSamples c(50, 0.2, 7, "pairs");
  EXPECT_EQ(test::error_of([&] { c.next(); }), "pairs: next() before open()");
  EXPECT_EQ(test::error_of([&] { c.heldout(5, 6); }), "pairs: held-out samples 5+6 outside 0..10");
  EXPECT_EQ(c.state(), "{}");
}

}  // namespace
}  // namespace fsdpx
