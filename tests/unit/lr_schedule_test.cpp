// The trainer's learning-rate schedules.
#include <gtest/gtest.h>

#include "fsdpx/framework/trainer/lr_schedule.h"
#include "test_paths.h"

namespace fsdpx {
namespace {
using test::error_of;

TEST(LrSchedule, ConstantWithWarmup) {
  auto s = LrSchedule::parse("constant", 0.1, 4, 100, 0.0);
  EXPECT_DOUBLE_EQ(s.at(0), 0.025);
  EXPECT_DOUBLE_EQ(s.at(3), 0.1);
  EXPECT_DOUBLE_EQ(s.at(50), 0.1);
}

TEST(LrSchedule, LinearWarmupThenCosine) {
  auto s = LrSchedule::parse("cosine", 1.0, 10, 110, 0.1);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);                      // half-way through warm-up
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);                     // peak when decay starts
  EXPECT_NEAR(s.at(60), 0.1 + 0.9 * 0.5, 1e-12);       // half-way: midpoint of peak and floor
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);                  // the floor
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);                  // and it stays there
  for (int64_t t = 11; t < 110; ++t) EXPECT_LE(s.at(t), s.at(t - 1)) << t;  // monotone decay
}

TEST(LrSchedule, BadSettings) {
  EXPECT_EQ(error_of([] { LrSchedule::parse("cosin", 1, 0, 10, 0); }),
            "unknown learning-rate schedule 'cosin'; use constant or cosine");
  EXPECT_EQ(error_of([] { LrSchedule::parse("cosine", 1, 20, 10, 0); }),
            "warm-up (20 steps) is longer than the run (10 steps)");
  EXPECT_EQ(error_of([] { LrSchedule::parse("cosine", -1, 0, 10, 0); }),
            "the peak learning rate must be positive, got -1.000000");
  EXPECT_EQ(error_of([] { LrSchedule::parse("cosine", 1, 0, 10, 2); }), "min_ratio must be in [0, 1], got 2.000000");
}

}  // namespace
}  // namespace fsdpx
