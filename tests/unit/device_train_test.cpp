// fsdpx-train on sim, the simulated accelerator (label device): the whole trainer on a device
// whose memory the host cannot read. sim runs the CPU's kernels, so every figure a run on sim
// reports must be the CPU run's, bit for bit; a difference is a bug in the device path (batches,
// the control group, host staging of checkpoints, cpu_offload's copies).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fsdpx/framework/runtime/build_info.h"
#include "test_paths.h"

using namespace fsdpx::test;
using nlohmann::json;

namespace {

using fsdpx::test::train;
using fsdpx::test::ckpt;

// --peak-tflops 1: no peak-FLOP probe (its matmuls on sim cost a quarter of a 2-rank run's CPU
// time); SimTrainOffload checks the probe on sim.
const char* const kTiny =
    " --model.size tiny --data.name synthetic --log-every 1 --clip-grad-norm 0.5 --peak-tflops 1 ";

// What a run reports that depends on the numbers alone: each step's loss and gradient norm, and
// the held-out loss (timings and memory left out).
std::string numbers(const std::filesystem::path& run) {
  std::string text;
  for (const json& j : read_json_lines(run / "metrics.jsonl")) {
    char l[160];
    if (j.contains("loss"))
      std::snprintf(l, sizeof l, "step %lld loss %.17g grad_norm %.17g\n", j["step"].get<long long>(),
                    j["loss"].get<double>(), j.value("grad_norm", -1.0));
    else if (j.contains("eval_loss"))
      std::snprintf(l, sizeof l, "eval %lld %.17g\n", j["step"].get<long long>(), j["eval_loss"].get<double>());
    else continue;
    text += l;
  }
  return text;
}

// The same run on the CPU and on sim, in `dir`: their numbers, which must be equal.
void expect_cpu_bits_in(const std::filesystem::path& dir, const std::string& flags, int ranks,
                        const char* base = kTiny) {
  const std::string launch = train() + " --nproc-per-node " + std::to_string(ranks) + base + flags;
  std::string got[2];
  const char* devices[2] = {"cpu", "sim"};
  for (int d = 0; d < 2; ++d) {
    const auto out = dir / devices[d];
    auto r = run_command(launch + " --device " + devices[d] + " --out " + out.string());
    ASSERT_EQ(r.exit_code, 0) << devices[d] << ": " << r.err;
    got[d] = numbers(out);
  }
  EXPECT_NE(got[0].find("step 4 loss"), std::string::npos) << got[0];
  EXPECT_EQ(got[1], got[0]) << flags << " at " << ranks << " rank(s)";
}

void expect_cpu_bits(const std::string& flags, int ranks, const char* base = kTiny) {
  TempDir dir;
  expect_cpu_bits_in(dir.path(), flags, ranks, base);
}

struct Strategy {
  const char* name;
  const char* flags;
  int ranks;
};
// The test's name shows the case's name (gtest would print the struct's bytes, pointers that
// change from build to build, so ctest's names and its cost data would too).
void PrintTo(const Strategy& s, std::ostream* os) { *os << s.name; }

class SimTrain : public ::testing::TestWithParam<Strategy> {};

// Every strategy at 1, 2 and 4 ranks, with clipping (the norm on the device).
TEST_P(SimTrain, GivesTheCpuLossesBitForBit) {
  expect_cpu_bits(std::string(GetParam().flags) + " --steps 4", GetParam().ranks);
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, SimTrain,
    ::testing::Values(Strategy{"full_shard_1", "--sharding.name full_shard", 1},
                      Strategy{"full_shard_2", "--sharding.name full_shard", 2},
                      Strategy{"full_shard_4", "--sharding.name full_shard", 4},
                      Strategy{"shard_grad_op_2", "--sharding.name shard_grad_op", 2},
                      Strategy{"no_shard_2", "--sharding.name no_shard", 2},
                      Strategy{"hybrid_shard_2x2", "--sharding.name hybrid_shard --sharding.shard_size 2", 4},
                      Strategy{"cpu_offload_1", "--sharding.name cpu_offload", 1},
                      Strategy{"cpu_offload_2", "--sharding.name cpu_offload", 2},
                      Strategy{"cpu_offload_hybrid_2x2",
                               "--sharding.name cpu_offload --sharding.base hybrid_shard --sharding.shard_size 2", 4}),
    [](const ::testing::TestParamInfo<Strategy>& i) { return std::string(i.param.name); });

// Recompute (the device generator replayed), bf16_mixed, fp16_mixed with its scaler, gradient
// accumulation, and the deterministic mode.
TEST(SimTrainModes, RecomputePrecisionsAccumulationAndDeterministicGiveTheCpuBits) {
  for (const char* flags : {"--activation-checkpointing Block", "--precision.name bf16_mixed",
                            "--precision.name fp16_mixed", "--grad-accum 2", "--deterministic"})
    expect_cpu_bits(std::string(flags) + " --steps 4", 2);
}

// t5 (an encoder-decoder whose shared embedding is used by units it does not belong to) on
// seq2seq pairs: the CPU's losses, held-out loss and exact match on sim.
TEST(SimTrainModes, T5OnSeq2SeqPairsGivesTheCpuBits) {
  TempDir dir;
  std::string pairs;
  for (int i = 0; i < 64; ++i)
    pairs += "{\"source\": \"add " + std::to_string(i) + " and " + std::to_string(i + 1) + "\", \"target\": \"" +
             std::to_string(2 * i + 1) + "\"}\n";
  write_file(dir.path() / "pairs.jsonl", pairs);
  expect_cpu_bits("--model.name t5 --data.name seq2seq --data.path " + (dir.path() / "pairs.jsonl").string() +
                      " --data.source_len 48 --data.target_len 40 --wrap.layer_types T5Block --batch-size 6 --steps 4",
                  2, " --log-every 1 --clip-grad-norm 0.5 ");
}

// Checkpoints go through host memory: the checkpoint a sim run saves has the CPU run's bytes, and a
// run resumed from it, on sim or on the CPU, continues with the uninterrupted run's losses.
TEST(SimTrainCheckpoints, SaveAndResumeGoThroughHostMemory) {
  TempDir dir;
  const std::string base = train() + " --nproc-per-node 2" + kTiny + "--checkpoint.name sharded --steps 4 ";
  for (const char* d : {"cpu", "sim"}) {
    auto r =
        run_command(base + "--save-every 2 --device " + d + " --out " + (dir.path() / d).string());
    ASSERT_EQ(r.exit_code, 0) << d << ": " << r.err;
  }
  const auto ckpt = [&](const char* d, int step) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%08d", step);
    return dir.path() / d / "checkpoints" / name;
  };
  for (int step : {2, 4}) EXPECT_EQ(tensor_digests(ckpt("sim", step)), tensor_digests(ckpt("cpu", step))) << step;
  const std::string whole = numbers(dir.path() / "sim");
  for (const char* d : {"sim", "cpu"}) {
    const auto out = dir.path() / (std::string("resumed-") + d);
    auto r = run_command(base + "--device " + d + " --resume " + ckpt("sim", 2).string() + " --out " +
                         out.string());
    ASSERT_EQ(r.exit_code, 0) << d << ": " << r.err;
    const std::string tail = numbers(out);
    EXPECT_NE(tail.find("step 3 loss"), std::string::npos) << tail;
    EXPECT_NE(whole.find(tail), std::string::npos) << d << " resumed:\n" << tail << "uninterrupted:\n" << whole;
  }
}

// Asynchronous saves on sim: staged from device memory into pinned pool buffers on the compute
// stream (the stream-order check holds the copies to the protocol), they hold the CPU's synchronous
// bytes; a rank killed while its writer writes leaves the save before complete, --resume auto
// takes it, and fsdpx-ckpt verify refuses the partial one.
TEST(SimTrainCheckpoints, AsyncSavesStageFromTheDeviceAndSurviveAKilledRank) {
  TempDir dir;
  const std::string base = "timeout 300 " + train() + " --nproc-per-node 2" + kTiny + "--checkpoint.name sharded ";
  const std::string async = "--checkpoint.async true --device sim ";
  auto cpu = run_command(base + "--steps 4 --save-every 2 --device cpu --out " + (dir.path() / "cpu").string());
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  auto sim = run_command(base + "--steps 4 --save-every 2 " + async + "--out " + (dir.path() / "sim").string());
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
  EXPECT_NE(sim.out.find("pool of at most 2048 MiB per rank (pinned memory)"), std::string::npos) << sim.out;
  for (const char* step : {"step-00000002", "step-00000004"})
    EXPECT_EQ(tensor_digests(dir.path() / "sim" / "checkpoints" / step),
              tensor_digests(dir.path() / "cpu" / "checkpoints" / step))
        << step;
  const std::filesystem::path out = dir.path() / "killed", root = out / "checkpoints";
  auto a = run_command(base + "--steps 2 " + async + "--out " + out.string());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  auto b = run_command("env FSDPX_FAULT=save-during-write:1 " + base + "--steps 4 --resume auto " + async + "--out " +
                       out.string());
  EXPECT_NE(b.exit_code, 0) << b.out << b.err;
  EXPECT_FALSE(std::filesystem::exists(root / "step-00000004"));
  auto partial = run_command(ckpt() + " verify " + (root / ".tmp-step-00000004").string());
  EXPECT_NE(partial.exit_code, 0) << partial.out;
  auto c = run_command(base + "--steps 4 --resume auto " + async + "--out " + out.string());
  ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
  EXPECT_NE(c.out.find("resumed from " + (root / "step-00000002").string() + " at step 2"), std::string::npos) << c.out;
  EXPECT_EQ(tensor_digests(root / "step-00000004"),
            tensor_digests(dir.path() / "cpu" / "checkpoints" / "step-00000004"));
}

// cpu_offload on sim: the device's allocated peak drops by what the plan says moves to host
// memory (this rank's parameter and gradient shards and optimizer state), measured on sim's
// allocator; the plan's host bytes are those the summary reports.
TEST(SimTrainOffload, TheDevicePeakDropsByThePlannedBytes) {
  TempDir dir;
  const std::string run = train() + " --nproc-per-node 2" + kTiny + "--steps 2 --device sim --model.layers 4 ";
  int64_t measured[2], planned[2];
  json summary[2];
  for (int off = 0; off < 2; ++off) {
    const auto out = dir.path() / (off ? "offload" : "base");
    auto r = run_command(run + "--sharding.name " + (off ? "cpu_offload" : "full_shard") + " --out " +
                         out.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    summary[off] = read_json(out / "summary.json");
    measured[off] = summary[off]["ranks"][0]["peak_allocated_bytes"].get<int64_t>();
    planned[off] = summary[off]["plan"]["memory"]["peak_bytes"].get<int64_t>();
    EXPECT_EQ(summary[off]["ranks"][0]["memory_device"], "sim:0");
    EXPECT_GE(summary[off]["ranks"][0]["peak_reserved_bytes"].get<int64_t>(), measured[off]);
  }
  const double drop = static_cast<double>(measured[0] - measured[1]),
               plan_drop = static_cast<double>(planned[0] - planned[1]);
  std::printf("device peak %lld -> %lld B with cpu_offload (planned %lld -> %lld)\n",
              static_cast<long long>(measured[0]), static_cast<long long>(measured[1]),
              static_cast<long long>(planned[0]), static_cast<long long>(planned[1]));
  EXPECT_GT(drop, 0);
  EXPECT_NEAR(drop, plan_drop, 0.02 * plan_drop);
  const json& rank = summary[1]["ranks"][0];
  EXPECT_EQ(
      summary[1]["plan"]["memory"]["host_bytes"].get<int64_t>(),
      rank["param_bytes"].get<int64_t>() + rank["grad_bytes"].get<int64_t>() + rank["optimizer_bytes"].get<int64_t>());
  EXPECT_EQ(summary[0]["plan"]["memory"]["host_bytes"].get<int64_t>(), 0);
}

// Under a device budget (FSDPX_SIM_MEMORY, 64 MiB), cpu_offload trains twice the layers: 4 layers
// fit without it, 8 do not (one line naming the device, the bytes asked and the bytes left), 8 fit with it.
// The peak-FLOP probe runs on the device after the model is there, within what is free: its
// 2048^2 matrices (16 MiB each) once ran the 4 layers out of memory.
TEST(SimTrainOffload, TrainsTwiceTheLayersInTheSameDeviceMemory) {
  TempDir dir;
  const std::string run = "env FSDPX_SIM_MEMORY=" + std::to_string(64 << 20) + " timeout 300 " + train() +
                          " --model.dim 256 --model.heads 4 --model.seq 32 --data.seq 32 --model.vocab 256 "
                          "--batch-size 1 --data.name synthetic --device sim --steps 1 --out ";
  auto fits = run_command(run + (dir.path() / "a").string() + " --model.layers 4 --sharding.name full_shard");
  ASSERT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_GT(read_json(dir.path() / "a" / "summary.json")["peak_tflops_per_rank"].get<double>(), 0);
  // 8 layers do not fit: refused before any step (the plan against sim's budget), and, started
  // anyway, sim's own out-of-memory error mid-run.
  auto over = run_command(run + (dir.path() / "b").string() + " --model.layers 8 --sharding.name full_shard");
  EXPECT_NE(over.exit_code, 0);
  EXPECT_NE(over.err.find("the plan does not fit this node: device sim:0: "), std::string::npos) << over.err;
  auto forced = run_command(run + (dir.path() / "b2").string() +
                            " --model.layers 8 --sharding.name full_shard --skip-memory-check");
  EXPECT_NE(forced.exit_code, 0);
  EXPECT_NE(forced.err.find("sim out of memory on sim:0: tried to allocate "), std::string::npos) << forced.err;
  EXPECT_NE(forced.err.find("left"), std::string::npos) << forced.err;
  auto offload = run_command(run + (dir.path() / "c").string() + " --model.layers 8 --sharding.name cpu_offload");
  EXPECT_EQ(offload.exit_code, 0) << offload.err;
}

// The host reads the loss from the device at log steps only (the steps between need no wait):
// every step's loss since the last log step at once. The losses logged, and the summary's first
// and last, are those of a run logging every step; a loss that diverged between two log steps is
// named with its own step.
TEST(SimTrainLosses, ReadAtLogStepsOnlyWithEveryStepsValue) {
  TempDir dir;
  const std::string run = "timeout 300 " + train() +
                          " --nproc-per-node 2 --model.size tiny --data.name synthetic --steps 8 --device sim ";
  auto every = run_command(run + "--log-every 1 --out " + (dir.path() / "every").string());
  ASSERT_EQ(every.exit_code, 0) << every.err;
  auto fourth = run_command(run + "--log-every 4 --out " + (dir.path() / "fourth").string());
  ASSERT_EQ(fourth.exit_code, 0) << fourth.err;
  std::map<int64_t, double> logged;
  for (const json& j : read_json_lines(dir.path() / "every" / "metrics.jsonl"))
    if (j.contains("loss")) logged[j["step"].get<int64_t>()] = j["loss"].get<double>();
  std::vector<int64_t> steps;
  for (const json& j : read_json_lines(dir.path() / "fourth" / "metrics.jsonl")) {
    if (!j.contains("loss")) continue;
    steps.push_back(j["step"].get<int64_t>());
    EXPECT_EQ(j["loss"].get<double>(), logged[steps.back()]) << "step " << steps.back();
    // Where each rank's step time went, from timing events on sim's compute stream: six phases that
    // add up to at most the step's wall time.
    ASSERT_EQ(j["step_breakdown_s"].size(), 2u) << j.dump();
    for (const json& rank : j["step_breakdown_s"]) {
      double sum = 0;
      for (const char* phase : {"forward", "backward", "all_gather_wait", "reduce_scatter_wait", "optimizer", "other"})
        sum += rank.at(phase).get<double>();
      EXPECT_GT(rank["forward"].get<double>(), 0) << rank.dump();
      EXPECT_GT(sum, 0) << rank.dump();
      EXPECT_LE(sum, j["step_time_s"].get<double>() * 1.01 + 1e-3) << j.dump();
    }
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 8}));
  const json summary = read_json(dir.path() / "fourth" / "summary.json");
  EXPECT_EQ(summary["first_loss"].get<double>(), logged[1]);
  EXPECT_EQ(summary["final_loss"].get<double>(), logged[8]);
  // lr 1e30: step 3's loss is not finite; it is read at step 4 and named as step 3's.
  auto diverged = run_command(run + "--log-every 4 --optimizer.lr 1e30 --out " + (dir.path() / "nan").string());
  EXPECT_NE(diverged.exit_code, 0);
  EXPECT_NE(diverged.err.find(" at step 3; training diverged"), std::string::npos) << diverged.err;
}

// A rank killed while the ranks train on sim (its collectives staged through Gloo), started as
// torchrun or srun would (no fsdpx launcher to notice): rank 0 names it within seconds from its
// stopped heartbeat, with its host and pid, instead of waiting out the collective timeout (60 s).
TEST(SimTrainFaults, ARankKilledWhileTrainingIsNamedBySurvivorsWithinSeconds) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  std::string script = "cd " + dir.path().string() + "\n";
  for (int r : {1, 0})
    script += "bash -c 'echo $$ > pid" + std::to_string(r) + "; RANK=" + std::to_string(r) +
              " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(r) +
              " LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " exec " + train() + kTiny +
              "--model.layers 8 --steps 100000 --device sim --watch-peers --collective-timeout 60' > r" +
              std::to_string(r) + ".out 2> r" + std::to_string(r) + ".err &\n";
  // Once rank 0 has logged step 2, rank 1 goes (SIGKILL: nothing of it runs after).
  script +=
      "for i in $(seq 400); do grep -q 'step 2/' r0.out 2>/dev/null && break; sleep 0.1; done\n"
      "date +%s.%N > killed; kill -9 $(cat pid1)\nwait\ndate +%s.%N > ended\n";
  write_file(dir.path() / "run.sh", script);
  run_command("bash " + (dir.path() / "run.sh").string());
  const std::string err0 = read_file(dir.path() / "r0.err");
  EXPECT_NE(err0.find("fsdpx: stopping rank 0: rank 1 is gone (no heartbeat in "), std::string::npos) << err0;
  EXPECT_NE(err0.find("pid " + read_file(dir.path() / "pid1").substr(0, read_file(dir.path() / "pid1").size() - 1)),
            std::string::npos)
      << err0;
  const double after = std::stod(read_file(dir.path() / "ended")) - std::stod(read_file(dir.path() / "killed"));
  std::printf("rank 0 ended %.2f s after rank 1 was killed\n", after);
  EXPECT_LT(after, 15.0);
}

// What cannot run is one line before any worker starts.
TEST(SimTrainBadInput, DevicesThatCannotRunAreOneLineBeforeAnyWorker) {
  TempDir dir;
  const std::string run = "timeout 120 " + train() + " --nproc-per-node 2" + kTiny + "--steps 1 ";
  auto no_lib =
      run_command("env FSDPX_SIM_LIBRARY=" + (dir.path() / "missing.so").string() + " " + run + "--device sim");
  EXPECT_EQ(no_lib.exit_code, 1);
  EXPECT_NE(no_lib.err.find("missing.so"), std::string::npos) << no_lib.err;
  EXPECT_EQ(no_lib.err.find("rank 1"), std::string::npos) << no_lib.err;
  auto nccl = run_command(run + "--device cpu --backend nccl");
  EXPECT_NE(nccl.exit_code, 0);
  EXPECT_NE(nccl.err.find("--backend nccl needs --device cuda, or --device sim"), std::string::npos) << nccl.err;
  // sim's NCCL twin (the default there), as NCCL, takes a device per rank; Gloo staging may share one.
  auto shared = run_command("env FSDPX_SIM_DEVICES=1 " + run + "--device sim");
  EXPECT_EQ(shared.exit_code, 1) << shared.err;
  EXPECT_NE(shared.err.find("--device sim: 2 ranks on this node but 1 device(s) visible"), std::string::npos)
      << shared.err;
  EXPECT_NE(shared.err.find("--share-gpus (NCCL, each rank a node of its own"), std::string::npos) << shared.err;
  EXPECT_EQ(std::count(shared.err.begin(), shared.err.end(), '\n'), 1) << shared.err;
  // --device cuda with no GPU visible (CUDA_VISIBLE_DEVICES empty hides a machine's GPUs, so this
  // branch runs on every machine), and with the GPUs this machine has and one rank more than them:
  // no GPU visible again, or more ranks than GPUs (NCCL, the default on CUDA, takes one per rank).
  const int gpus = fsdpx::build_info().cuda_devices;  // libfsdpx_cuda.so's count: no CUDA is loaded here
  const std::string more_ranks = "--nproc-per-node " + std::to_string(gpus + 1) + " ";
  auto hidden = run_command("env CUDA_VISIBLE_DEVICES= " + run + "--device cuda");
  auto cuda = run_command("timeout 120 " + train() + kTiny + "--steps 1 --device cuda " + more_ranks);
  const std::string too_many = std::to_string(gpus + 1) + " ranks on this node but " + std::to_string(gpus) +
                               " device(s) visible, and NCCL takes one rank per device";
  for (const auto& [r, want] : {std::pair<const CommandResult&, std::string>{hidden, "no GPU visible"},
                                {cuda, gpus == 0 ? "no GPU visible" : too_many}}) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("--device cuda: " + want), std::string::npos) << "want '" << want << "': " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// --share-gpus: ranks share one sim device over the NCCL twin, each posing to it as a node of its own
// (its own NCCL_HOSTID, as NCCL needs), with the CPU's bits at 2 and 4 ranks; the memory check
// adds up the ranks on a device. Without the flag, and without a host id of its own, the twin
// refuses two ranks on one device of one host, as NCCL does ("Duplicate GPU detected").
TEST(SimShareGpus, RanksShareOneDeviceOverTheNcclTwin) {
  TempDir dir;
  const std::string base = std::string(kTiny) + "--steps 4 ";
  for (int n : {2, 4}) {
    const std::string launch = train() + " --nproc-per-node " + std::to_string(n) + base;
    const auto cpu = dir.path() / ("cpu" + std::to_string(n)), sim = dir.path() / ("sim" + std::to_string(n));
    auto c = run_command(launch + "--out " + cpu.string());
    ASSERT_EQ(c.exit_code, 0) << c.err;
    auto r = run_command("env FSDPX_SIM_DEVICES=1 " + launch + "--device sim --share-gpus --out " + sim.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(numbers(sim), numbers(cpu)) << n << " ranks on one sim device";
    EXPECT_NE(r.out.find("ranks share devices (--share-gpus): " + std::to_string(n) +
                         " local ranks on 1 sim device(s), each a node of its own to NCCL (rank 0: NCCL_HOSTID="),
              std::string::npos) << r.out;
    EXPECT_NE(r.out.find("/fsdpx-local-rank-0 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1)"), std::string::npos) << r.out;
    const json summary = read_json(sim / "summary.json");
    for (const json& rank : summary["ranks"]) EXPECT_EQ(rank["memory_device"], "sim:0");
  }
  // A budget that holds one rank's peak and a half: two ranks on one device do not fit, on two they do.
  const int64_t peak = read_json(dir.path() / "sim2" / "summary.json")["plan"]["memory"]["peak_bytes"];
  const std::string budget = "env FSDPX_SIM_MEMORY=" + std::to_string(peak * 3 / 2) + " ";
  const std::string two = train() + " --nproc-per-node 2" + base + "--device sim --share-gpus ";
  auto one_device = run_command(budget + "FSDPX_SIM_DEVICES=1 " + two + "--out " + (dir.path() / "tight").string());
  EXPECT_EQ(one_device.exit_code, 1) << one_device.err;
  EXPECT_NE(one_device.err.find("the plan does not fit this node: device sim: 2 ranks x "), std::string::npos)
      << one_device.err;
  EXPECT_NE(one_device.err.find("put fewer ranks on each device"), std::string::npos) << one_device.err;
  auto two_devices = run_command(budget + "FSDPX_SIM_DEVICES=2 " + two + "--out " + (dir.path() / "fits").string());
  EXPECT_EQ(two_devices.exit_code, 0) << two_devices.err;
  // The twin's own rule, below fsdpx-train's check: collectives of two ranks on one device.
  const std::string worker = comm_worker() + " --nproc-per-node 2 --scenario collectives --device sim";
  auto duplicate = run_command("env FSDPX_SIM_DEVICES=1 timeout 120 " + worker);
  EXPECT_NE(duplicate.exit_code, 0);
  EXPECT_NE(duplicate.err.find("sim NCCL twin: Duplicate GPU detected: rank 1 and rank 0 both on sim:0 of one host"),
            std::string::npos) << duplicate.err;
  auto posed = run_command("env FSDPX_SIM_DEVICES=1 FSDPX_SHARE_GPUS=1 timeout 120 " + worker);
  EXPECT_EQ(posed.exit_code, 0) << posed.err;
  EXPECT_NE(posed.out.find("collectives ok on sim:0"), std::string::npos) << posed.out;
  // Where Gloo carries the collectives the flag has nothing to do: refused, not ignored.
  auto on_cpu = run_command(train() + " --nproc-per-node 2" + base + "--share-gpus");
  EXPECT_EQ(on_cpu.exit_code, 1);
  EXPECT_NE(on_cpu.err.find("--share-gpus lets ranks share devices over NCCL, and this run's collectives are Gloo's "
                            "(--device cpu)"), std::string::npos) << on_cpu.err;
}

// cpu_offload over hybrid_shard at shard_size 1 (a GPU per node): each rank's gradient is whole,
// averaged across the replicas, and its shard lives in host memory, which a collective must not
// be handed (NCCL takes device tensors only). The all-reduce runs on a device buffer: the CPU's
// losses bit for bit at 2 ranks, with the layout asked for and a device peak the plan predicts.
TEST(SimTrainOffload, HybridAtShardSizeOneGivesTheCpuBits) {
  TempDir dir;
  expect_cpu_bits_in(dir.path(), "--steps 4 --sharding.name cpu_offload --sharding.base hybrid_shard "
                     "--sharding.shard_size 1", 2);
  const json summary = read_json(dir.path() / "sim" / "summary.json");
  EXPECT_EQ(summary["plan"]["shard_group_size"], 1);
  EXPECT_EQ(summary["plan"]["replicate_group_size"], 2);
  EXPECT_GT(summary["plan"]["memory"]["host_bytes"].get<int64_t>(), 0);
  const json& rank = summary["ranks"][0];
  EXPECT_EQ(rank["memory_device"], "sim:0");
  const double measured = rank["peak_allocated_bytes"].get<double>(),
               planned = summary["plan"]["memory"]["peak_bytes"].get<double>();
  EXPECT_NEAR(measured, planned, 0.1 * planned);
}

}  // namespace
