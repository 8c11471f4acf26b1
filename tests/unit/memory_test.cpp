// Memory that scales as 1/N, end to end through fsdpx-train on real Gloo groups, measured by the
// counting allocator (fsdpx/framework/runtime/memory_accounting.h): what a step holds beyond its
// shards does not grow with depth; the plan predicts the step's peak; a run that cannot fit its
// device or its host is refused before any step, by every rank at once; a worker the kernel kills
// is reported as such.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <ostream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ops/randint.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fsdpx/framework/checkpoint/safetensors.h"

#include "test_paths.h"

using namespace fsdpx::test;
using json = nlohmann::json;

namespace {

using fsdpx::test::train;

struct Measured {
  json plan;          // plan.json as summary.json holds it
  json step;          // the last step's metrics line
  int64_t held = 0;   // the plan's per-rank shards: parameters, gradients, optimizer state
};

// Steps of gpt on synthetic tokens (two unless `args` says); `args` adds to them. The runs at 1b
// width (about 25 s alone, four times that beside other heavy tests) pass a longer `timeout_s`.
Measured run_gpt(int nproc, const std::string& args, int timeout_s = 180) {
  TempDir dir;
  const std::string cmd = train() + " --nproc-per-node " + std::to_string(nproc) +
                          " --data.name synthetic --peak-tflops 1 --log-every 1 " +
                          (args.find("--steps") == std::string::npos ? "--steps 2 " : "") + args + " --out " +
                          dir.path().string();
  auto r = run_command(cmd, timeout_s);
  Measured m;
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.out << r.err;
  if (r.exit_code != 0) return m;
  m.plan = read_json(dir.path() / "summary.json")["plan"];
  m.step = step_metrics(dir.path()).back();
  m.held = m.plan["param_bytes"].get<int64_t>() + m.plan["grad_bytes"].get<int64_t>() +
           m.plan["optimizer_bytes"].get<int64_t>();
  return m;
}

int64_t measured_peak(const Measured& m) { return m.step["step_peak_allocated_bytes"].get<int64_t>(); }

// Gathered bytes the plan's units hold between forward and backward without resharding.
int64_t held_gathered(const Measured& m) {
  int64_t b = 0;
  for (const auto& u : m.plan["units"])
    if (!u["reshard_after_forward"].get<bool>() && !u["unit"].get<std::string>().empty())
      b += u["gathered_bytes"].get<int64_t>();
  return b;
}

struct Growth {
  int nproc;
  std::string args;
  std::string name;
};

void PrintTo(const Growth& g, std::ostream* os) { *os << g.name; }

class DepthGrowth : public ::testing::TestWithParam<Growth> {};

// From 2 to 8 layers the step's allocated peak grows by what the 6 layers hold (their shards,
// their activations, and where the strategy keeps units gathered through the step, their
// gathered parameters) plus at most 5%: nothing transient accumulates per layer. Before the
// bounded reductions it grew by 1.5x (every unit's packed gradients and receive buffer stayed
// until the end of backward).
TEST_P(DepthGrowth, PeakGrowsByTheAddedLayersOwnBytes) {
  const Growth g = GetParam();
  const std::string model = " --model.dim 512 --model.heads 8 --data.seq 8 --batch-size 1 --optimizer.name sgd ";
  const Measured two = run_gpt(g.nproc, model + "--model.layers 2 " + g.args);
  const Measured eight = run_gpt(g.nproc, model + "--model.layers 8 " + g.args);
  if (two.plan.is_null() || eight.plan.is_null()) return;
  const int64_t added = (eight.held - two.held) + (held_gathered(eight) - held_gathered(two)) +
                        (eight.plan["memory"]["activation_bytes"].get<int64_t>() -
                         two.plan["memory"]["activation_bytes"].get<int64_t>());
  const int64_t growth = measured_peak(eight) - measured_peak(two);
  std::printf("%s at %d ranks: peak %lld -> %lld B, growth %lld B for %lld B the 6 layers hold (%.3fx)\n",
              g.args.c_str(), g.nproc, (long long)measured_peak(two), (long long)measured_peak(eight),
              (long long)growth, (long long)added, static_cast<double>(growth) / static_cast<double>(added));
  EXPECT_GT(added, 0);
  EXPECT_LE(growth, added + added / 20);
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, DepthGrowth,
    ::testing::Values(Growth{2, "--sharding.name full_shard", "full_shard_2"},
                      Growth{4, "--sharding.name full_shard", "full_shard_4"},
                      Growth{2, "--sharding.name shard_grad_op", "shard_grad_op_2"},
                      Growth{4, "--sharding.name shard_grad_op", "shard_grad_op_4"},
                      Growth{4, "--sharding.name hybrid_shard --sharding.shard_size 2", "hybrid_shard_4"},
                      Growth{2, "--deterministic", "deterministic_2"}, Growth{4, "--deterministic", "deterministic_4"}),
    [](const ::testing::TestParamInfo<Growth>& i) { return i.param.name; });

struct Shape {
  std::string model;  // gpt's size options
  int nproc;
  std::string name;
  bool heavy = false;  // 1b width: activations a negligible part of the peak
};

void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

class PredictedPeak : public ::testing::TestWithParam<Shape> {};

const char* const kSmall = "--model.size small --data.seq 64 --batch-size 4";
const char* const k1bWidth = "--model.size 1b --model.layers 2 --data.seq 16 --batch-size 1 --optimizer.name sgd";

// The plan's predicted step peak (the engine's protocol replayed in bytes, with the activations
// gpt states) is within 10% of the allocated peak a run measures, for every strategy, with and
// without activation checkpointing (one rank: one layout whatever the strategy; hybrid_shard:
// 2 x 2 at 4 ranks). Measured within 3% from gpt tiny to 1b width. One step each: the next ones
// hold the same (gradient shards are released after each optimizer step). At 1b width and 16
// tokens the activations are 0.4% of the peak (7.85 MiB of 2.03 GiB at 2 ranks), so checkpointing
// changes the peak far less than the 10% checked: its prediction is checked at tiny and small,
// where activations are a large part, and the 1b runs go without it (each takes about 25 s).
TEST_P(PredictedPeak, WithinTenPercentOfTheMeasuredPeak) {
  const Shape s = GetParam();
  std::vector<std::string> strategies{"full_shard"};
  if (s.nproc > 1) strategies = {"full_shard", "shard_grad_op", "no_shard"};
  if (s.nproc == 4) strategies.push_back("hybrid_shard --sharding.shard_size 2");
  std::vector<const char*> checkpointing{"", " --activation-checkpointing Block"};
  if (s.heavy) checkpointing.pop_back();
  for (const auto& strategy : strategies)
    for (const char* ac : checkpointing) {
      const std::string args = s.model + " --steps 1 --sharding.name " + strategy + ac;
      SCOPED_TRACE(args);
      const Measured m = run_gpt(s.nproc, args, s.heavy ? 400 : 180);
      if (m.plan.is_null()) continue;
      const double predicted = m.plan["memory"]["peak_bytes"].get<double>();
      const double measured = static_cast<double>(measured_peak(m));
      std::printf("%-96s %d ranks: predicted %.2f MiB, measured %.2f MiB (%.3f)\n", args.c_str(), s.nproc,
                  predicted / (1 << 20), measured / (1 << 20), measured / predicted);
      EXPECT_NEAR(measured / predicted, 1.0, 0.10) << m.plan["memory"].dump();
    }
}

INSTANTIATE_TEST_SUITE_P(
    Gpt, PredictedPeak,
    ::testing::Values(Shape{"--model.size tiny", 1, "tiny_1"}, Shape{"--model.size tiny", 2, "tiny_2"},
                      Shape{"--model.size tiny", 4, "tiny_4"}, Shape{kSmall, 1, "small_1"}, Shape{kSmall, 2, "small_2"},
                      Shape{kSmall, 4, "small_4"},
                      // 1b width, 2 layers: the shards, not the activations, dominate.
                      Shape{k1bWidth, 1, "width_1b_1", true}, Shape{k1bWidth, 2, "width_1b_2", true},
                      Shape{k1bWidth, 4, "width_1b_4", true}),
    [](const ::testing::TestParamInfo<Shape>& i) { return i.param.name; });

// vit's plan against its measured peak, as gpt's above: within 10%, with and without DeepViT's
// re-attention (whose attention maps, [B, H, T, T] several times over, are most of its
// activations) and recomputed blocks, under full_shard, shard_grad_op and no_shard at 2 ranks, at
// two sizes: 32x32 RGB images in 4x4 patches (65 tokens), width 128, 4 blocks, 8 images a rank;
// and 64x64 in 8x8 patches, width 256, 2 blocks, 4 images. Measured 0.95 to 1.03.
TEST(VitPredictedPeak, WithinTenPercentOfTheMeasuredPeak) {
  TempDir dir;
  for (const int64_t size : {32, 64}) {
    const std::string images = (dir.path() / ("images" + std::to_string(size) + ".safetensors")).string();
    const at::Tensor x = at::randint(0, 256, {32, 3, size, size}, at::kByte), y = at::randint(0, 10, {32}, at::kLong);
    fsdpx::SafetensorsWriter w(images, {{"images", at::kByte, x.sizes().vec()}, {"labels", at::kLong, {32}}}, {});
    w.write(x);
    w.write(y);
    w.close();
    const std::string model =
        " --model.name vit --model.channels 3 --data.name images --data.path " + images +
        (size == 32
             ? " --model.image 32 --model.patch 4 --model.dim 128 --model.heads 4 --model.layers 4 --batch-size 8"
             : " --model.image 64 --model.patch 8 --model.dim 256 --model.heads 8 --model.layers 2 --batch-size 4") +
        " --steps 1 --peak-tflops 1 --log-every 1";
    for (const char* deep : {"", " --model.reattention true"})
      for (const char* strategy : {"full_shard", "shard_grad_op", "no_shard"})
        for (const char* ac : {"", " --activation-checkpointing Block"}) {
          const std::string args = model + deep + " --sharding.name " + strategy + ac;
          SCOPED_TRACE(args);
          TempDir out;
          auto r = run_command(train() + " --nproc-per-node 2" + args + " --out " + out.path().string());
          ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
          const json plan = read_json(out.path() / "summary.json")["plan"];
          const double predicted = plan["memory"]["peak_bytes"].get<double>();
          const double measured = step_metrics(out.path()).back()["step_peak_allocated_bytes"].get<double>();
          std::printf("vit %lldx%lld%s %s%s: predicted %.2f MiB, measured %.2f MiB (%.3f)\n", (long long)size,
                      (long long)size, deep, strategy, ac, predicted / (1 << 20), measured / (1 << 20),
                      measured / predicted);
          EXPECT_NEAR(measured / predicted, 1.0, 0.10);
        }
  }
}

// float8's plan against its measured peak, as bf16_mixed's above: its casts are transients of a
// linear's forward and backward (one fp32 copy and one float8 copy of an operand at a time), which
// the plan leaves out. Measured 0.995 (tiny), 1.025 and 1.048 (small, without and with recomputed
// Blocks), 1.000 (1b width) at 2 ranks.
TEST(Float8PredictedPeak, WithinTenPercentOfTheMeasuredPeak) {
  for (const char* args : {"--model.size tiny", "--model.size small --data.seq 64 --batch-size 4",
                           "--model.size small --data.seq 64 --batch-size 4 --activation-checkpointing Block",
                           "--model.size small --data.seq 64 --batch-size 4 --precision.float8_all_gather true"}) {
    SCOPED_TRACE(args);
    const Measured m = run_gpt(2, std::string(args) + " --steps 1 --precision.name float8");
    if (m.plan.is_null()) continue;
    const double predicted = m.plan["memory"]["peak_bytes"].get<double>();
    EXPECT_NEAR(static_cast<double>(measured_peak(m)) / predicted, 1.0, 0.10) << m.plan["memory"].dump();
  }
}

// The root wrap (no unit but the root, FSDP's default): the plan's one unit and its peak within
// 10% of the measured one, gpt small (8 Blocks) at 2 ranks. Against Block units: under full_shard
// the whole model is gathered at once rather than a Block at a time, so the peak rises, by what
// the plan says within kRiseTolerance (measured 7.58 MiB for 8.59 predicted: a difference of two
// peaks carries both their errors); under shard_grad_op every unit stays gathered from its forward
// to its backward either way, so the peaks are the same, as planned.
TEST(RootWrapPredictedPeak, WithinTenPercentAndAboveTheBlockUnitsPeakWhereTheyReshard) {
  constexpr double kRiseTolerance = 0.25;
  for (const char* strategy : {"full_shard", "shard_grad_op"}) {
    const std::string args = std::string(kSmall) + " --steps 1 --sharding.name " + strategy;
    SCOPED_TRACE(args);
    const Measured root = run_gpt(2, args + " --wrap.name root");
    const Measured blocks = run_gpt(2, args);
    if (root.plan.is_null() || blocks.plan.is_null()) continue;
    EXPECT_EQ(root.plan["units"].size(), 1u) << root.plan["units"].dump();
    const double predicted = root.plan["memory"]["peak_bytes"].get<double>();
    const double measured = static_cast<double>(measured_peak(root));
    EXPECT_NEAR(measured / predicted, 1.0, 0.10) << root.plan["memory"].dump();
    const double rise = measured - static_cast<double>(measured_peak(blocks));
    const double predicted_rise = predicted - blocks.plan["memory"]["peak_bytes"].get<double>();
    std::printf("%s: root-only peak %.2f MiB (predicted %.2f), %.2f MiB above Block units' (predicted %.2f)\n",
                strategy, measured / (1 << 20), predicted / (1 << 20), rise / (1 << 20), predicted_rise / (1 << 20));
    if (std::string(strategy) == "full_shard") {
      EXPECT_GT(predicted_rise, 0);
      EXPECT_NEAR(rise / predicted_rise, 1.0, kRiseTolerance);
    } else {
      EXPECT_EQ(predicted_rise, 0);
      EXPECT_NEAR(rise, 0, 0.01 * measured);
    }
  }
}

// What the system counts of a step, predicted (the plan's resident peak: the allocated peak, the
// CPU block cache's slack and the process's own bytes) within 10% of the peak RSS each rank
// measures, gpt at 1b width, where the tensors dominate: with SGD and with AdamW (whose state adds
// blocks of other sizes). Measured within 2%.
TEST(HostResident, PredictedWithinTenPercentOfTheMeasuredRss) {
  for (const char* optimizer : {"sgd", "adamw"}) {
    SCOPED_TRACE(optimizer);
    TempDir dir;
    auto r = run_command(train() + " --nproc-per-node 2 --data.name synthetic --peak-tflops 1 --steps 3 "
                         "--model.size 1b --model.layers 4 --data.seq 32 --batch-size 1 --optimizer.name " +
                         optimizer + " --out " + dir.path().string(), 400);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json summary = read_json(dir.path() / "summary.json");
    const json& memory = summary["plan"]["memory"];
    const double predicted = memory["resident_peak_bytes"].get<double>() + memory["process_bytes"].get<double>();
    double measured = 0;
    for (const json& rank : summary["ranks"]) measured = std::max(measured, rank["peak_rss_bytes"].get<double>());
    std::printf("%s: predicted %.1f MiB resident, measured %.1f MiB (%.3f); allocated peak %.1f MiB\n", optimizer,
                predicted / (1 << 20), measured / (1 << 20), measured / predicted,
                memory["peak_bytes"].get<double>() / (1 << 20));
    EXPECT_NEAR(measured / predicted, 1.0, 0.10);
  }
}

// A plan that cannot fit (llama3-8b on one rank: 128 GB of fp32 parameters, gradients and AdamW
// state) stops before any worker starts, with one line naming the planned and the available
// bytes and the ways out.
TEST(MemoryCheck, APlanThatCannotFitIsRefusedBeforeAnyWorkerStarts) {
  for (const char* launch : {" --nproc-per-node 2", ""}) {
    auto r = run_command(train() + launch + " --model.size llama3-8b --data.name synthetic --data.seq 16 --steps 1");
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("the plan does not fit this node"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("is available ("), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--activation-checkpointing"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--skip-memory-check"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("[rank"), std::string::npos) << "a worker started:\n" << r.err;
  }
  // Far more local ranks than the machine can run: one line, no worker.
  auto r = run_command(train() +
                       " --nproc-per-node 1000 --skip-memory-check --data.name synthetic --data.samples 10000 "
                       "--batch-size 1 --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("starts more workers than this machine can run"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[rank"), std::string::npos) << r.err;
}

int lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n + (!text.empty() && text.back() != '\n');
}

// A memory cgroup of this test's own (v1 or v2, where this process may make one): its path, or ""
// with the reason in `why`. Removed, with whatever still runs in it, by the destructor.
class MemoryCgroup {
 public:
  explicit MemoryCgroup(int64_t limit) {
    limit = limit / 4096 * 4096;  // the kernel keeps whole pages
    const std::string name = "fsdpx-memory-test-" + std::to_string(::getpid());
    for (const auto& [root, file] : {std::pair<std::string, std::string>{"/sys/fs/cgroup", "memory.max"},
                                     {"/sys/fs/cgroup/memory", "memory.limit_in_bytes"}}) {
      if (file == "memory.max" && read_file(root + "/cgroup.controllers").find("memory") == std::string::npos) continue;
      const std::string dir = root + "/" + name;
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) continue;
      std::ofstream(dir + "/" + file) << limit;
      if (read_file(dir + "/" + file).find(std::to_string(limit)) == 0) {
        path_ = dir;
        return;
      }
      ::rmdir(dir.c_str());
    }
    why = "no writable memory cgroup (v2 /sys/fs/cgroup with the memory controller, or v1 /sys/fs/cgroup/memory)";
  }
  ~MemoryCgroup() {
    if (path_.empty()) return;
    for (int i = 0; i < 50 && ::rmdir(path_.c_str()) != 0; ++i) {
      std::istringstream pids(read_file(path_ + "/cgroup.procs"));
      for (long pid; pids >> pid;) ::kill(static_cast<pid_t>(pid), SIGKILL);
      ::usleep(100000);
    }
  }
  const std::string& path() const { return path_; }
  std::string why;

 private:
  std::string path_;
};

// A plan whose allocated bytes fit a memory cgroup's limit but whose resident bytes (what the
// system counts: the allocated peak, the block cache's slack, each process's own) do not: refused
// before any worker starts, in one line naming both figures. The limit lies between the two, about
// one rank's slack from each (gpt at 1b width, 2 layers: 5% of 1.94 GiB), far beyond what the
// launcher's own resident bytes vary by between two starts (a few MiB).
TEST(MemoryCheck, AResidentPeakOverACgroupsLimitIsRefusedWhereTheAllocatedPeakFits) {
  const std::string run = train() + " --nproc-per-node 2 --data.name synthetic --steps 1 " + k1bWidth;
  auto dry = run_command(run + " --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  const std::smatch peak = [&] {
    std::smatch m;
    std::regex_search(dry.out, m, std::regex("peak       \\S+ \\S+ \\((\\d+) B\\) per rank, allocated"));
    return m;
  }();
  std::smatch resident;
  ASSERT_TRUE(peak.size() == 2 && std::regex_search(dry.out, resident,
                                                    std::regex("resident   \\S+ \\S+ \\((\\d+) B\\) per rank")))
      << dry.out;
  const int64_t allocated = std::stoll(peak[1]), resident_bytes = std::stoll(resident[1]);
  const int64_t slack = resident_bytes - allocated;  // per rank, the process's bytes included
  const int64_t process = resident_bytes - allocated - allocated * 5 / 100;
  ASSERT_GT(slack, int64_t{64} << 20) << dry.out;
  // Two ranks' allocated peaks and one rank's slack, and the processes' own bytes: the plan counts
  // them twice (the ranks'), the cgroup holds the launcher's already, less its pages of files
  // (measured: about half of them): refused by about a rank's slack, fitting by as much without it.
  const int64_t limit = 5 * process / 2 + 2 * allocated + allocated * 5 / 100;
  MemoryCgroup cgroup(limit);
  if (cgroup.path().empty()) GTEST_SKIP() << cgroup.why;
  auto r = run_command("sh -c 'echo $$ > " + cgroup.path() + "/cgroup.procs && exec " + run + "'");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("the plan does not fit this node: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("; host: 2 ranks x "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" resident ("), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" allocated and the block cache's slack)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is available (the memory cgroup " + cgroup.path()), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[rank"), std::string::npos) << "a worker started:\n" << r.err;
}

const char* const kSimSmall = " --device sim --model.size small --data.name synthetic --steps 1 --log-every 1 ";
const std::string k64MiB = std::to_string(64 << 20);

// A device budget smaller than the plan's peak per rank (sim, FSDPX_SIM_MEMORY) is refused by the
// launcher in one line before any worker starts, naming both sides' planned and available bytes
// and the ways out; sim reads the budget in bytes or with a unit (64MiB) alike.
TEST(MemoryCheck, ADeviceBudgetTooSmallIsRefusedBeforeAnyWorkerStarts) {
  for (const std::string& budget : {k64MiB, std::string("64MiB")}) {
    SCOPED_TRACE(budget);
    auto r = run_command("env FSDPX_SIM_MEMORY=" + budget + " timeout 120 " + train() + " --nproc-per-node 2" +
                         kSimSmall);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_EQ(r.err.rfind("fsdpx-train: the plan does not fit this node: device sim: 1 rank x ", 0), 0u) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(" is available (sim's budget per device, FSDPX_SIM_MEMORY=" + budget), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("): does not fit; host: 2 ranks x "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--sharding.name cpu_offload"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--activation-checkpointing Block"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--skip-memory-check"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;
    EXPECT_NE(r.err.find("64.00 MiB (67108864 B) is available"), std::string::npos) << r.err;
  }
}

// Two ranks started as torchrun starts them (no fsdpx launcher): they agree on the verdict after
// the rendezvous, so every rank ends at once with the same line, also when the budget is only
// rank 1's (the other rank's device fits), instead of waiting out the rendezvous timeout (90 s).
TEST(MemoryCheck, UnderTorchrunEveryRankEndsAtOnceWithTheSameRefusal) {
  for (const std::string where : {"both", "rank 1"}) {
    SCOPED_TRACE(where);
    TempDir dir;
    const std::string port = std::to_string(free_port());
    std::string script = "cd " + dir.path().string() + "\ndate +%s.%N > start\n";
    for (int r : {0, 1}) {
      const std::string n = std::to_string(r);
      const bool budget = where == "both" || r == 1;
      script += "(" + (budget ? "FSDPX_SIM_MEMORY=" + k64MiB + " " : std::string()) + "RANK=" + n +
                " WORLD_SIZE=2 LOCAL_RANK=" + n + " LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port +
                " timeout 120 " + train() + kSimSmall + "--rendezvous-timeout 90 > r" + n + ".out 2> r" + n +
                ".err; echo $? > r" + n + ".code; date +%s.%N > r" + n + ".end) &\n";
    }
    write_file(dir.path() / "run.sh", script + "wait\n");
    run_command("bash " + (dir.path() / "run.sh").string());
    auto text = [&](const std::string& name) { return read_file(dir.path() / name); };
    const std::string refused = "fsdpx-train: rank " + std::string(where == "both" ? "0" : "1") +
                                ": the plan does not fit this node: device sim:";
    for (const std::string n : {"0", "1"}) {
      const std::string err = text("r" + n + ".err");
      EXPECT_EQ(text("r" + n + ".code"), "1\n") << "rank " << n << ": " << err;
      EXPECT_EQ(err.rfind(refused, 0), 0u) << "rank " << n << ": " << err;
      EXPECT_EQ(lines(err), 1) << "rank " << n << ": " << err;
      EXPECT_EQ(text("r" + n + ".out").find("step "), std::string::npos) << text("r" + n + ".out");
      const double after = std::stod(text("r" + n + ".end")) - std::stod(text("start"));
      std::printf("budget on %s: rank %s ended %.2f s after the start\n", where.c_str(), n.c_str(), after);
      EXPECT_LT(after, 30.0) << "rank " << n << " waited: " << err;
    }
  }
}

// A budget that fits is no refusal: the run trains, and --dry-run shows the device's side.
TEST(MemoryCheck, ADeviceBudgetThatFitsTrains) {
  TempDir dir;
  const std::string run = "env FSDPX_SIM_MEMORY=" + std::to_string(1 << 30) + " timeout 300 " + train() +
                          " --nproc-per-node 2 --device sim --model.size tiny --data.name synthetic --steps 1 ";
  auto r = run_command(run + "--out " + dir.path().string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("does not fit"), std::string::npos) << r.err;
  auto dry = run_command(run + "--dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_NE(dry.out.find("  memory     device sim: 1 rank x "), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find(" is available (sim's budget per device, FSDPX_SIM_MEMORY=1073741824): fits\n"),
            std::string::npos)
      << dry.out;
  EXPECT_NE(dry.out.find("             host: 2 ranks x "), std::string::npos) << dry.out;
  // --dry-run reports a budget that does not fit without refusing it.
  auto over = run_command("env FSDPX_SIM_MEMORY=" + k64MiB + " " + train() + kSimSmall + "--dry-run");
  EXPECT_EQ(over.exit_code, 0) << over.err;
  EXPECT_NE(over.out.find("FSDPX_SIM_MEMORY=" + k64MiB + "): does not fit\n"), std::string::npos) << over.out;
}

// The host's side: cpu_offload moves llama3-8b's shards and optimizer state (128 GB at one rank)
// into host memory, where they do not fit, while the device's peak fits its budget (1 TiB). Refused
// naming the host, from the launcher and from a rank alike.
TEST(MemoryCheck, OffloadedBytesThatTheHostCannotHoldAreRefused) {
  for (const char* launch : {" --nproc-per-node 2", ""}) {
    SCOPED_TRACE(launch);
    auto r = run_command("env FSDPX_SIM_MEMORY=1099511627776 timeout 120 " + train() + launch +
                         " --device sim --sharding.name cpu_offload --model.size llama3-8b --data.name synthetic "
                         "--data.seq 16 --steps 1");
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("FSDPX_SIM_MEMORY=1099511627776): fits; host: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(" offloaded (cpu_offload)"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("): does not fit; spread the ranks over more nodes"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("a strategy without cpu_offload"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("[rank"), std::string::npos) << "a worker started:\n" << r.err;
  }
}

// --max-memory-mib checks the plan's measure: allocated bytes, not RSS.
TEST(MemoryCheck, MaxMemoryMibChecksTheAllocatedPeak) {
  auto r = run_command(train() + " --nproc-per-node 2 --model.size small --data.name synthetic --steps 2 "
                                 "--peak-tflops 1 --max-memory-mib 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("MiB allocated on a rank (the plan's measure), over --max-memory-mib 1"), std::string::npos)
      << r.err;
}

// A worker killed by SIGKILL from outside (as the kernel's out-of-memory killer does) is named,
// with the plan's figure for a rank.
TEST(MemoryCheck, AWorkerKilledFromOutsideIsReportedAsProbablyOutOfMemory) {
  TempDir dir;
  const std::string out = dir.path().string();
  write_file(dir.path() / "kill.sh",
             train() +
                 " --nproc-per-node 2 --model.size tiny --data.name synthetic --steps 100000 --log-every 1 "
                 "--peak-tflops 1 --out " +
                 out + "/run > " + out +
                 "/log 2>&1 &\n"
                 "L=$!\n"
                 "for i in $(seq 600); do grep -q step " +
                 out +
                 "/run/metrics.jsonl 2>/dev/null && break; sleep 0.1; done\n"
                 "kill -9 $(pgrep -P $L | tail -1)\n"
                 "wait $L\n"
                 "echo exit=$?\n");
  auto r = run_command("timeout 120 bash " + out + "/kill.sh");
  const std::string log = read_file(dir.path() / "log");
  EXPECT_NE(r.out.find("exit=137"), std::string::npos) << r.out << log;
  EXPECT_NE(log.find("was killed by signal 9 (Killed), probably by the kernel's out-of-memory killer: the plan's peak "
                     "per rank is"),
            std::string::npos)
      << log;
}

}  // namespace
