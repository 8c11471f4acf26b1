// fsdpx-train's memory options, each against the run without it.
// - The optimizer step inside backward (--optimizer-in-backward, EngineOptions::step_in_backward):
//   each unit's shards are stepped as soon as their gradients are reduced, and the gradient shard
//   is freed at once. It gives the bits of the step after backward (losses, every weight, and
//   through fsdpx-train every optimizer state tensor) at 1, 2 and 4 ranks with every strategy, on
//   the CPU and on sim (whose stream-order check holds it to the stream protocol); the plan states
//   what it saves; what needs every gradient before a step is refused in one line.
// - Gradient shards in bf16 (bf16_mixed's keep_low_precision_grads): half their bytes, and the
//   losses of fp32 gradient shards.
// - cpu_offload on a device: the plan's peak unit counts the unit's copy on the device.
// - Activation offload (--activation-offload): on sim, the recomputed units' inputs go to host
//   memory and come back with the bits of the run without it; the device's peak falls by the
//   plan's saving; sim's stream-order check holds the copies to the protocol; on the CPU it is
//   said once; a type that is not recomputed or not the model's is refused in one line.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fsdpx/error.h"
#include "fsdpx/optimizer.h"
#include "test_paths.h"

namespace fsdpx {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

using fsdpx::test::train;
using fsdpx::test::engine_worker;

struct Case {
  std::string name, device, args;
  std::vector<int> ranks;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class InBackward : public ::testing::TestWithParam<Case> {};

// tests/workers/engine_worker: gpt tiny, 3 steps, with and without --step-in-backward; the losses
// and every parameter afterwards byte for byte (AdamW's update reads its moments, so equal weights
// after three steps need equal state too).
TEST_P(InBackward, SameBitsAsTheStepAfterBackward) {
  const Case& c = GetParam();
  test::TempDir dir;
  // Under the sanitizers one world size per case (its first besides 1): the same code, a third
  // of the time.
  std::vector<int> ranks = c.ranks;
  if (test::under_sanitizers() && ranks.size() > 1) ranks = {ranks[ranks.front() == 1 ? 1 : 0]};
  for (int n : ranks) {
    std::map<std::string, std::string> files;
    for (const char* way : {"after", "inside"}) {
      const std::string out = (dir.path() / (std::string(way) + std::to_string(n))).string();
      const std::string inside = std::string(way) == "inside" ? " --step-in-backward" : "";
      auto r = test::run_command(engine_worker() + " --nproc-per-node " + std::to_string(n) +
                                 " --steps 3 --device " + c.device + " " + c.args + inside + " --out " + out);
      ASSERT_EQ(r.exit_code, 0) << way << " " << n << "\n" << r.out << r.err;
      files[std::string(way) + ".losses"] = test::read_file(out + ".losses");
      files[std::string(way) + ".params"] = test::read_file(out + ".params");
      if (c.device == "sim" && inside.size()) {
        const std::string streams = test::read_file(out + ".streams.0");
        EXPECT_NE(streams.find("hazards 0\n"), std::string::npos) << streams;
      }
    }
    EXPECT_FALSE(files["after.losses"].empty());
    EXPECT_EQ(files["inside.losses"], files["after.losses"]) << c.name << " at " << n << " ranks";
    EXPECT_TRUE(files["inside.params"] == files["after.params"]) << c.name << " at " << n << " ranks: weights differ";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, InBackward,
    ::testing::Values(Case{"cpu_full_shard", "cpu", "--strategy full_shard --optimizer adamw", {1, 2, 4}},
                      Case{"cpu_shard_grad_op", "cpu", "--strategy shard_grad_op --optimizer adamw", {2, 4}},
                      Case{"cpu_no_shard", "cpu", "--strategy no_shard --optimizer adamw", {2, 4}},
                      Case{"cpu_hybrid_shard", "cpu", "--strategy full_shard --hybrid-shard 2 --optimizer adamw", {4}},
                      // Micro-batches without sync keep their unsharded gradients; the last one steps.
                      Case{"cpu_accumulation", "cpu", "--strategy full_shard --optimizer adamw --accum 2", {2}},
                      Case{"cpu_sgd_momentum", "cpu",
                           "--strategy shard_grad_op --optimizer sgd --optimizer-option momentum=0.9", {2}},
                      Case{"cpu_anyprecision_adamw", "cpu", "--strategy full_shard --optimizer anyprecision_adamw",
                           {2}},
                      Case{"sim_full_shard", "sim", "--strategy full_shard --optimizer adamw", {1, 2, 4}},
                      Case{"sim_no_shard", "sim", "--strategy no_shard --optimizer adamw", {2}},
                      Case{"sim_hybrid_shard", "sim", "--strategy full_shard --hybrid-shard 2 --optimizer adamw", {4}},
                      Case{"sim_cpu_offload", "sim", "--strategy full_shard --offload --optimizer adamw", {2, 4}},
                      Case{"sim_bf16_mixed", "sim", "--strategy shard_grad_op --precision bf16_mixed --optimizer adamw",
                           {2}}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

struct TrainedRun {
  std::vector<double> losses;
  std::map<std::string, std::string> digests;  // weights and optimizer state after the last step
  json plan;
  json last;  // the last step's metrics
  std::string config;
};

TrainedRun fsdpx_train(const std::string& flags, const fs::path& out) {
  auto r = test::run_command(train() + " --data.seq 32 --log-every 1 --steps 4 --checkpoint.name sharded" +
                             test::kNoEval + flags + " --out " + out.string());
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.out << r.err;
  TrainedRun run;
  if (r.exit_code != 0) return run;
  for (const auto& m : test::step_metrics(out)) run.losses.push_back(m.at("loss").get<double>());
  run.last = test::step_metrics(out).back();
  run.digests = test::tensor_digests(out / "checkpoints" / "step-00000004");
  run.plan = test::read_json(out / "plan.json");
  run.config = test::read_file((out / "config.ini").string());
  return run;
}

// Through fsdpx-train, with micro-batches: the losses, and every weight and optimizer state tensor
// of the last checkpoint; the run records the option, and its plan the saving.
TEST(OptimizerInBackward, TheTrainerGivesTheBitsOfTheStepAfterBackward) {
  test::TempDir dir;
  const std::string flags = "--nproc-per-node 2 --batch-size 2 --grad-accum 2";
  const TrainedRun after = fsdpx_train(flags, dir.path() / "after");
  const TrainedRun inside = fsdpx_train(flags + " --optimizer-in-backward", dir.path() / "inside");
  ASSERT_EQ(after.losses.size(), 4u);
  EXPECT_EQ(inside.losses, after.losses);
  ASSERT_GT(after.digests.size(), 0u);
  EXPECT_EQ(inside.digests, after.digests);
  EXPECT_TRUE(inside.plan["optimizer_in_backward"].get<bool>());
  EXPECT_FALSE(after.plan["optimizer_in_backward"].get<bool>());
  // The plan states the saving (gpt tiny's peak comes before any gradient shard is held: nothing
  // saved here; the next test measures one).
  EXPECT_TRUE(inside.plan["option_savings"].contains("--optimizer-in-backward")) << inside.plan.dump();
  EXPECT_TRUE(after.plan["option_savings"].empty()) << after.plan.dump();
  EXPECT_NE(inside.config.find("optimizer-in-backward=true"), std::string::npos) << inside.config;
  EXPECT_EQ(after.config.find("optimizer-in-backward"), std::string::npos) << after.config;
}

// A memory option's two runs of fsdpx-train, without it ("without") and with it ("with"): each
// one's plan, losses and last step's metrics.
struct OptionRuns {
  std::map<std::string, json> plan, last;
  std::map<std::string, std::vector<double>> losses;
  double measured(const std::string& w) { return last[w]["step_peak_allocated_bytes"].get<double>(); }
  double predicted(const std::string& w) { return plan[w]["memory"]["peak_bytes"].get<double>(); }
  // The plan predicts both peaks within 10%, and its saving is the difference of the two; returned.
  double checked_saving(const std::string& option) {
    for (const std::string way : {"without", "with"})
      EXPECT_NEAR(measured(way) / predicted(way), 1.0, 0.10) << way << ": " << plan[way]["memory"].dump();
    const double saving = plan["with"]["option_savings"][option].get<double>();
    EXPECT_NEAR(saving, predicted("without") - predicted("with"), 0.5);
    return saving;
  }
};

OptionRuns run_without_and_with(const fs::path& dir, const std::string& flags, const std::string& option) {
  OptionRuns runs;
  for (const std::string way : {"without", "with"}) {
    const fs::path out = dir / way;
    auto r = test::run_command(train() + " " + flags + (way == "with" ? " " + option : "") + " --out " + out.string());
    EXPECT_EQ(r.exit_code, 0) << way << "\n" << r.out << r.err;
    if (r.exit_code != 0) continue;
    runs.plan[way] = test::read_json(out / "plan.json");
    for (const auto& m : test::step_metrics(out)) runs.losses[way].push_back(m.at("loss").get<double>());
    runs.last[way] = test::step_metrics(out).back();
  }
  return runs;
}

// gpt small of 8 layers, AdamW, 2 ranks, few activations (1 x 16 tokens per rank), so that the
// gradient shards held late in backward make the peak: the step's allocated peak per rank falls,
// the plan predicts both peaks within 10%, and the measured drop is the plan's saving within 10%
// of the peak.
TEST(OptimizerInBackward, ThePeakFallsByWhatThePlanSays) {
  test::TempDir dir;
  OptionRuns r = run_without_and_with(dir.path(),
                                      "--nproc-per-node 2 --model.size small --model.layers 8 --data.name synthetic "
                                      "--data.seq 16 --batch-size 1 --peak-tflops 1 --steps 2 --log-every 1",
                                      "--optimizer-in-backward");
  ASSERT_EQ(r.plan.size(), 2u);
  const double saving = r.checked_saving("--optimizer-in-backward");
  EXPECT_GT(saving, 0.08 * r.predicted("without")) << "the gradient shards are a large part of this peak";
  EXPECT_NEAR(r.measured("without") - r.measured("with"), saving, 0.10 * r.predicted("without"));
  std::printf("gpt small of 8 layers, 2 ranks, AdamW: peak %.1f MiB after backward, %.1f MiB inside (%.3fx); "
              "planned saving %.1f MiB\n",
              r.measured("without") / (1 << 20), r.measured("with") / (1 << 20),
              r.measured("with") / r.measured("without"), saving / (1 << 20));
}

// Each case's flags after `quick`: fsdpx-train exits non-zero with one line holding the message.
void expect_refused(const std::string& quick, const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [flags, message] : cases) {
    SCOPED_TRACE(flags);
    auto r = test::run_command(train() + quick + flags);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(test::count_of(r.err, "\n"), 1) << r.err;
  }
}

// What needs every gradient before any step: one line naming the conflict, before any rank starts.
TEST(OptimizerInBackward, WhatNeedsEveryGradientFirstIsRefused) {
  const std::string quick = " --data.name synthetic --data.seq 16 --batch-size 2 --steps 1 --optimizer-in-backward ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--clip-grad-norm 1", "--clip-grad-norm needs the norm of every gradient before any step; drop one of them"},
      {"--deterministic", "--deterministic adds every sample's gradients into the shards one backward at a time"},
      {"--precision.name fp16_mixed", "precision 'fp16_mixed' scales the loss, whose step must first check every "
                                      "gradient for inf/NaN"},
      {"--plugin " + test::fixture("cuda_only_optimizer").string() + " --optimizer.name cuda_only_adam",
       "optimizer 'cuda_only_adam' updates all its shards at once only (it does not implement "
       "Optimizer::step_shards)"},
      {"--plugin " + test::fixture("abi_1_1_optimizer").string() + " --optimizer.name abi_1_1_sgd",
       "--optimizer-in-backward: optimizer 'abi_1_1_sgd' (plugin fixture_abi_1_1_optimizer) was built against "
       "plugin ABI 1.1, before Optimizer::step_shards (1.2); rebuild it"}};
  expect_refused(quick, cases);
}

struct Steps {
  std::vector<double> losses;
  json plan, last;
};

// 30 steps (10 under the sanitizers: the same code, a third of the time).
Steps thirty_steps(const std::string& flags, const fs::path& out) {
  const std::string steps = test::under_sanitizers() ? "10" : "30";
  auto r = test::run_command(train() + " --data.seq 32 --log-every 1" + test::kNoEval + "--steps " + steps +
                             " --precision.name bf16_mixed --precision.reduce_dtype bf16 " + flags + " --out " +
                             out.string());
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.out << r.err;
  Steps s;
  if (r.exit_code != 0) return s;
  for (const auto& m : test::step_metrics(out)) s.losses.push_back(m.at("loss").get<double>());
  s.last = test::step_metrics(out).back();
  s.plan = test::read_json(out / "plan.json");
  return s;
}

double largest_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// gpt tiny, 30 steps, bf16_mixed reducing in bf16, gradient shards in fp32 against bf16: half the
// gradient bytes (the plan's; the measured peak of the optimizer phase, where every gradient shard
// is held, falls by at least 3/4 of that: the step widens one shard at a time), and the plan
// predicts that phase within 10%. The losses are bit for bit fp32 gradient shards' where nothing adds
// into a shard (full_shard: each reduced bf16 value is stored once, and fp32 holds it exactly); with
// hybrid_shard the average across replicas runs in the gradient dtype: within 1e-3 over 30 steps.
TEST(LowPrecisionGradients, HalfTheBytesAndTheLossesOfFp32GradientShards) {
  test::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"full_shard", "--nproc-per-node 2 --batch-size 4"},
      {"hybrid_shard", "--nproc-per-node 4 --batch-size 2 --sharding.name hybrid_shard --sharding.shard_size 2"}};
  for (const auto& [name, flags] : layouts) {
    SCOPED_TRACE(name);
    const Steps fp32 = thirty_steps(flags, dir.path() / (name + "-fp32"));
    const Steps bf16 =
        thirty_steps(flags + " --precision.keep_low_precision_grads true", dir.path() / (name + "-bf16"));
    const size_t steps = test::under_sanitizers() ? 10 : 30;
    ASSERT_EQ(fp32.losses.size(), steps);
    ASSERT_EQ(bf16.losses.size(), steps);
    const int64_t saved = fp32.plan["grad_bytes"].get<int64_t>() - bf16.plan["grad_bytes"].get<int64_t>();
    EXPECT_EQ(2 * bf16.plan["grad_bytes"].get<int64_t>(), fp32.plan["grad_bytes"].get<int64_t>());
    auto optimizer_peak = [](const Steps& s) {
      return s.last["phase_peak_allocated_bytes"]["optimizer"].get<int64_t>();
    };
    const int64_t fell = optimizer_peak(fp32) - optimizer_peak(bf16);
    EXPECT_GE(4 * fell, 3 * saved) << fell << " of " << saved;
    EXPECT_LE(fell, saved);
    const double planned = bf16.plan["memory"]["optimizer_peak_bytes"].get<double>();
    EXPECT_NEAR(static_cast<double>(optimizer_peak(bf16)) / planned, 1.0, 0.10);
    const double worst = largest_difference(fp32.losses, bf16.losses);
    if (name == "full_shard") {
      EXPECT_EQ(bf16.losses, fp32.losses);
      // The same bits with the step inside backward (each unit's bf16 gradients widened as it
      // steps), and with SGD's per-shard widening (momentum).
      const Steps inside = thirty_steps(flags + " --precision.keep_low_precision_grads true --optimizer-in-backward",
                                        dir.path() / "inside");
      EXPECT_EQ(inside.losses, fp32.losses);
      const std::string sgd = " --optimizer.name sgd --optimizer.momentum 0.9";
      const Steps sgd32 = thirty_steps(flags + sgd, dir.path() / "sgd-fp32");
      const Steps sgd16 = thirty_steps(flags + sgd + " --precision.keep_low_precision_grads true", dir.path() / "sgd");
      EXPECT_FALSE(sgd32.losses.empty());
      EXPECT_EQ(sgd16.losses, sgd32.losses);
    } else {
      EXPECT_LE(worst, 1e-3);
    }
    std::printf("%s: gradient shards %lld -> %lld B per rank; the optimizer phase's peak %lld -> %lld B; largest loss "
                "difference over %zu steps %.3g\n",
                name.c_str(), static_cast<long long>(fp32.plan["grad_bytes"].get<int64_t>()),
                static_cast<long long>(bf16.plan["grad_bytes"].get<int64_t>()),
                static_cast<long long>(optimizer_peak(fp32)), static_cast<long long>(optimizer_peak(bf16)), steps,
                worst);
  }
}

// keep_low_precision_grads with fp32 reductions would keep nothing lower: refused in one line.
TEST(LowPrecisionGradients, WithFp32ReductionsIsRefused) {
  auto r = test::run_command(train() + " --data.name synthetic --data.seq 16 --batch-size 2 --steps 1 "
                                       "--precision.name bf16_mixed --precision.keep_low_precision_grads true");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("keep_low_precision_grads keeps the gradient shards in reduce_dtype, which is fp32 here"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(test::count_of(r.err, "\n"), 1) << r.err;
}

// cpu_offload on a device at one rank: every unit still comes to the device (in the compute
// dtype), so the plan's "peak unit" counts that copy (it said "none gathered", as for the
// parameters used in place on the CPU).
TEST(OffloadPlan, OneRankCountsEachUnitsCopyOnTheDevice) {
  test::TempDir dir;
  auto r = test::run_command(train() + " --device sim --sharding.name cpu_offload --nproc-per-node 1 --data.name "
                                       "synthetic --data.seq 16 --batch-size 2 --dry-run --out " + dir.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json plan = test::read_json(dir.path() / "plan.json");
  int64_t largest = 0;
  for (const auto& u : plan["units"]) {
    EXPECT_EQ(u["gathered_bytes"].get<int64_t>(), 4 * u["shard_numel"].get<int64_t>()) << u.dump();
    largest = std::max(largest, u["gathered_bytes"].get<int64_t>());
  }
  EXPECT_GT(largest, 0);
  EXPECT_EQ(plan["peak_unit_bytes"].get<int64_t>(), largest);
  EXPECT_EQ(r.out.find("none gathered"), std::string::npos) << r.out;
}

// The SDK's defaults for an optimizer that does not step a range of shards, and the range check.
class WholeStepOnly final : public Optimizer {
 public:
  void init(std::vector<ParamShard>) override {}
  void step(double) override {}
  double base_lr() const override { return 1; }
  ShardState state(const std::string&) const override { return {}; }
  void load_state(const std::string&, const ShardState&) override {}
};

TEST(OptimizerInBackward, TheSdkDefaultsSayNo) {
  WholeStepOnly opt;
  EXPECT_FALSE(opt.can_step_shards());
  EXPECT_THROW(opt.step_shards(0.1, 0, 1), Error);
  EXPECT_NO_THROW(check_shard_range("adamw", 2, 3, 5));
  try {
    check_shard_range("adamw", 4, 2, 5);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "adamw: step_shards was asked for shards 4 to 6, but init() took 5; pass a range of the "
                           "shards it took");
  }
}

// gpt's embedding and output projection as units of their own (torchtitan's wrapping), at 2
// ranks with a vocabulary that makes them most of the model: the same loss bits as Blocks alone
// (a reduction over two ranks adds the same two values whatever the grouping), a lower measured
// peak, and the plan predicts both within 10%. On sim as on the CPU.
class EmbeddingUnits : public ::testing::TestWithParam<std::string> {};

TEST_P(EmbeddingUnits, TheSameBitsAndALowerPeakThePlanPredicts) {
  test::TempDir dir;
  OptionRuns r = run_without_and_with(
      dir.path(),
      "--nproc-per-node 2 --device " + GetParam() +
          " --model.vocab 8192 --model.layers 4 --data.name synthetic --data.vocab 8192 --data.seq 16 "
          "--batch-size 1 --optimizer.name adamw --peak-tflops 1 --steps 3 --log-every 1",
      "--wrap.layer_types Block,Embedding,Output");
  ASSERT_EQ(r.losses["without"].size(), 3u);
  EXPECT_EQ(r.losses["with"], r.losses["without"]);
  for (const std::string way : {"without", "with"})
    EXPECT_NEAR(r.measured(way) / r.predicted(way), 1.0, 0.10) << way << ": " << r.plan[way]["memory"].dump();
  // The two tables (8192 x 64, fp32) are 2 MiB each: no longer gathered through the whole step.
  EXPECT_LT(r.measured("with"), 0.85 * r.measured("without"));
  std::vector<std::string> units;
  for (const auto& u : r.plan["with"]["units"]) units.push_back(u["unit"].get<std::string>());
  EXPECT_EQ(units.front(), "");  // the root, then the units in module order
  EXPECT_NE(std::find(units.begin(), units.end(), "tok_embeddings"), units.end()) << r.plan["with"]["units"].dump();
  EXPECT_NE(std::find(units.begin(), units.end(), "output"), units.end()) << r.plan["with"]["units"].dump();
  std::printf("gpt tiny, vocabulary 8192, 2 ranks, %s: peak %.2f MiB with Blocks as units, %.2f MiB with the "
              "embedding and output too (%.3fx)\n",
              GetParam().c_str(), r.measured("without") / (1 << 20), r.measured("with") / (1 << 20),
              r.measured("with") / r.measured("without"));
}

INSTANTIATE_TEST_SUITE_P(Devices, EmbeddingUnits, ::testing::Values("cpu", "sim"),
                         [](const auto& p) { return p.param; });

// Tied to the output projection, the embedding's table is used after the last layer: refused as
// a unit in one line that lists the layer types that can be.
TEST(EmbeddingUnits, ATiedEmbeddingIsRefused) {
  expect_refused(" --data.name synthetic --data.seq 16 --batch-size 2 --steps 1 --model.tie_embeddings true ",
                 {{"--wrap.layer_types Block,Embedding",
                   "unit 'tok_embeddings' is a Embedding, which fsdpx cannot hook: only layers declared with "
                   "FSDPX_MODULE (fsdpx/unit.h) can be units; this model's wrappable layer types: Block, Attention, "
                   "FeedForward"}});
}

// gpt of 8 blocks 64 wide, 32 x 128 tokens per rank, every Block recomputed, 2 ranks on sim, with
// and without --activation-offload Block. The forward's input of each block (1 MiB) is what
// activation checkpointing keeps; offloaded, at most two are on the device at once.
const char* const kOffloadRun = " --nproc-per-node 2 --device sim --model.dim 64 --model.heads 2 --model.layers 8 "
                                "--model.seq 128 --data.seq 128 --data.name synthetic --batch-size 32 --steps 2 "
                                "--log-every 1 --activation-checkpointing Block ";

TEST(ActivationOffload, OnSimTheDevicePeakFallsByThePlannedBytesWithTheSameBits) {
  test::TempDir dir;
  OptionRuns r = run_without_and_with(dir.path(), kOffloadRun, "--activation-offload Block");
  ASSERT_EQ(r.plan.size(), 2u);
  ASSERT_EQ(r.losses["without"].size(), 2u);
  EXPECT_EQ(r.losses["with"], r.losses["without"]);  // bit for bit: the same inputs come back
  const double saving = r.checked_saving("--activation-offload");
  const double input = 32.0 * 128 * 64 * 4;  // one block's input, fp32
  EXPECT_GE(saving, 4 * input) << r.plan["with"]["memory"].dump();
  EXPECT_NEAR(r.measured("without") - r.measured("with"), saving, 0.10 * saving);
  EXPECT_EQ(r.plan["with"]["memory"]["activation_host_bytes"].get<double>(), 8 * input);
  EXPECT_EQ(r.plan["without"]["memory"]["activation_host_bytes"].get<double>(), 0);
  std::printf("activation offload on sim, gpt 8 x 64 wide, 32 x 128 tokens, 2 ranks: peak %.2f MiB kept, "
              "%.2f MiB offloaded (%.3fx); planned saving %.2f MiB, measured %.2f MiB\n",
              r.measured("without") / (1 << 20), r.measured("with") / (1 << 20),
              r.measured("with") / r.measured("without"), saving / (1 << 20),
              (r.measured("without") - r.measured("with")) / (1 << 20));
}

// A rank that lets the offloaded inputs go before the compute stream waited for their copies (as a
// bug would): on a GPU that memory could be handed out while the copy reads it; sim names it.
TEST(ActivationOffload, InputsFreedBeforeTheirCopyAreAHazardOnSim) {
  test::TempDir dir;
  auto r = test::run_command("env FSDPX_FAULT=skip-offload-wait:0 " + train() + kOffloadRun +
                             "--activation-offload Block --out " + (dir.path() / "run").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("skip-offload-wait"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sim stream-order hazard"), std::string::npos) << r.err;
}

// On the CPU nothing moves: said once, in the plan and config.ini, and the run is the recomputed one.
TEST(ActivationOffload, OnTheCpuItIsSaidOnce) {
  test::TempDir dir;
  const fs::path out = dir.path() / "run";
  auto r = test::run_command(train() + " --data.name synthetic --data.seq 16 --batch-size 2 --steps 1 "
                             "--activation-checkpointing Block --activation-offload Block --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string said = "--activation-offload: the compute device is the CPU, where the activations are in host "
                           "memory already; nothing to move";
  EXPECT_EQ(test::count_of(r.out + r.err, said), 1) << r.out << r.err;
  const json plan = test::read_json(out / "plan.json");
  EXPECT_NE(plan["not_applied"].dump().find(said), std::string::npos) << plan.dump();
  EXPECT_EQ(plan["memory"]["activation_host_bytes"].get<int64_t>(), 0);
  EXPECT_FALSE(plan["option_savings"].contains("--activation-offload"));
}

// One line each, before any rank starts.
TEST(ActivationOffload, WhatCannotMoveIsRefused) {
  const std::string quick = " --data.name synthetic --data.seq 16 --batch-size 2 --steps 1 --device sim ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--activation-offload Block",
       "--activation-offload Block: Block does not recompute its activations, and only a recomputed unit's inputs "
       "can move (LibTorch's C++ autograd has no saved-tensor hooks); add Block to --activation-checkpointing too"},
      {"--activation-checkpointing Block --activation-offload Blok",
       "--activation-offload Blok: the model has no layer type 'Blok'; its layer types are: "},
      {"--activation-checkpointing Block --activation-offload Blok", "did you mean 'Block'?"}};
  expect_refused(quick, cases);
}

}  // namespace
}  // namespace fsdpx
