// Training in float8 (--precision float8) follows bf16_mixed: the demo's run (gpt tiny, 300 steps
// on the fortunes corpus, 2 ranks, configs/demo.ini) in both precisions, from the same weights on
// the same batches. Its losses equal torchao's to the bit (VsFsdp2.Float8EqualsFsdp2WithTorchaosFloat8);
// here, the curve float8's rounding makes of them.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "test_paths.h"

namespace fsdpx {
namespace {
namespace fs = std::filesystem;

// Measured: at most 1.8% apart at any step, 0.4% on average, the last 50 steps' means 0.05%; with
// float8 all-gather (another trajectory from step 30 on) 3.1% and 1.6%. The gap is the
// trajectory's, either way: at seeds 1 and 2 both float8 runs end 0.5-3.4% below bf16_mixed's.
constexpr double kMaxStepGap = 0.05;
constexpr double kLastStepsGap = 0.01;
constexpr double kLastStepsGapGathered = 0.03;
constexpr int kLastSteps = 50;

std::map<int64_t, double> demo_losses(const std::string& precision, const fs::path& out) {
  const auto r =
      test::run_command(test::train() + " --config " + (test::source_dir() / "configs" / "demo.ini").string() +
                        " --nproc-per-node 2 --log-every 1 --eval-every 0 --checkpoint.name none"
                        " --peak-tflops 1 --precision.name " +
                        precision + " --out " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::map<int64_t, double> losses;
  for (const auto& m : test::step_metrics(out)) losses[m["step"].get<int64_t>()] = m["loss"].get<double>();
  return losses;
}

// And with float8 all-gather (the weights cast from their fp32 shards), the same bounds.
TEST(Float8Training, TheDemosLossCurveStaysWithinAFewPercentOfBf16Mixeds) {
  test::TempDir dir;
  const auto bf16 = demo_losses("bf16_mixed", dir.path() / "bf16");
  ASSERT_EQ(bf16.size(), 300u);
  for (const std::string precision : {"float8", "float8 --precision.float8_all_gather true"}) {
    SCOPED_TRACE(precision);
    const auto f8 = demo_losses(precision, dir.path() / (precision == "float8" ? "float8" : "gathered"));
    ASSERT_EQ(f8.size(), 300u);
    EXPECT_NE(bf16.at(1), f8.at(1));  // float8 did compute in float8 from the first step
    double worst = 0, last_bf16 = 0, last_f8 = 0;
    for (const auto& [step, loss] : bf16) {
      worst = std::max(worst, std::abs(f8.at(step) / loss - 1));
      if (step > 300 - kLastSteps) {
        last_bf16 += loss;
        last_f8 += f8.at(step);
      }
    }
    std::printf("%s: at most %.4f from bf16_mixed's loss, last %d steps %.4f\n", precision.c_str(), worst, kLastSteps,
                std::abs(last_f8 / last_bf16 - 1));
    EXPECT_LT(worst, kMaxStepGap);
    EXPECT_LT(std::abs(last_f8 / last_bf16 - 1), precision == "float8" ? kLastStepsGap : kLastStepsGapGathered);
    EXPECT_LT(last_f8 / kLastSteps, 0.5 * f8.at(1));  // and it trained: from 5.5 to about 2.5
  }
}

// float8 all-gather sends a Block's linear weights in e4m3, one byte each for bf16_mixed's two: a
// Block's all-gather at most this much of bf16_mixed's (its norms stay bf16: 0.501 for gpt small).
constexpr double kFloat8GatherRatio = 0.52;

// The bytes gpt small's units all-gather with float8 all-gather, against bf16_mixed's, as planned;
// and what the run's counting communicator counts of them equals the plan.
TEST(Float8AllGather, HalvesTheBlocksAllGatherBytesAsCounted) {
  test::TempDir dir;
  const std::string common = test::train() +
                             " --nproc-per-node 2 --model.size small --data.name synthetic --data.seq 32 --batch-size 2"
                             " --steps 1 --log-every 1 --peak-tflops 1 --eval-every 0";
  const auto plan_of = [&](const std::string& precision, const std::string& name) {
    const auto r = test::run_command(common + " --dry-run " + precision + " --out " + (dir.path() / name).string());
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return test::read_json(dir.path() / name / "plan.json");
  };
  const std::string f8 = "--precision.name float8 --precision.float8_all_gather true";
  const auto bf16 = plan_of("--precision.name bf16_mixed", "bf16"), gathered = plan_of(f8, "f8");
  ASSERT_EQ(bf16["units"].size(), gathered["units"].size());
  size_t blocks = 0;
  for (size_t i = 1; i < bf16["units"].size(); ++i) {  // the Blocks (the root's tables stay bf16)
    const double ratio =
        gathered["units"][i]["gather_bytes"].get<double>() / bf16["units"][i]["gather_bytes"].get<double>();
    EXPECT_LE(ratio, kFloat8GatherRatio) << gathered["units"][i]["unit"];
    EXPECT_GT(ratio, 0.5) << gathered["units"][i]["unit"];  // the norms stay bf16
    ++blocks;
  }
  EXPECT_EQ(blocks, 4u);  // gpt small: 4 Blocks
  const auto r = test::run_command(common + " " + f8 + " --out " + (dir.path() / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto summary = test::read_json(dir.path() / "run" / "summary.json");
  for (const char* k : {"allgather_bytes", "all_reduce_bytes", "sent_bytes"})
    EXPECT_EQ(summary["last_step_comm"][k], gathered[k]) << k;
  EXPECT_LT(gathered["allgather_bytes"].get<double>(), 0.6 * bf16["allgather_bytes"].get<double>());
}

}  // namespace
}  // namespace fsdpx
