// The device tests again on CUDA, and what only a GPU can show. Built and run on every CI run:
// without a GPU each test reports itself skipped with the reason (never passed). make gpu-check
// runs them on the first GPU (ctest -L gpu).
#include <gtest/gtest.h>

#include "fsdpx/framework/runtime/build_info.h"
#include "test_paths.h"

namespace {

// From libfsdpx_cuda.so, which build_info loads: this binary links LibTorch's CPU libraries only.
int gpus() { return fsdpx::build_info().cuda_devices; }

#define FSDPX_NEEDS_GPUS(n)                                     \
  if (gpus() < (n))                                             \
  GTEST_SKIP() << "needs " << (n) << " CUDA GPU(s), " << gpus() \
               << " visible here: the CUDA "                    \
                  "path is compiled and linked, its logic tested on sim; make gpu-check runs this"

using fsdpx::test::engine_worker;

// The engine_worker's mean losses of `args` at `n` ranks.
std::vector<double> losses(const std::string& args, int n, const std::string& out) {
  auto r = fsdpx::test::run_command(engine_worker() + " --nproc-per-node " + std::to_string(n) + " --steps 3 " +
                                        args + " --out " + out,
                                    600);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.out << r.err;
  std::vector<double> v;
  std::istringstream in(fsdpx::test::read_file(out + ".losses"));
  for (double x; in >> x;) v.push_back(x);
  return v;
}

// The engine on CUDA gives the CPU's losses within fp32 rounding (cuBLAS and CPU kernels add in
// different orders), every strategy: NCCL at one rank, and two ranks sharing the GPU over Gloo.
TEST(Gpu, EngineOnCudaMatchesTheCpu) {
  FSDPX_NEEDS_GPUS(1);
  fsdpx::test::TempDir dir;
  for (const char* strategy : {"full_shard", "shard_grad_op", "no_shard"})
    for (const auto& [n, backend] : {std::pair<int, const char*>{1, "default"}, {2, "gloo"}}) {
      const std::string base = std::string("--strategy ") + strategy;
      const auto cpu = losses(base, n, (dir.path() / "cpu").string());
      const auto gpu = losses(base + " --device cuda --backend " + backend, n, (dir.path() / "gpu").string());
      ASSERT_EQ(cpu.size(), gpu.size());
      for (size_t i = 0; i < cpu.size(); ++i)
        EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * std::abs(cpu[i])) << strategy << " at " << n << " rank(s), step " << i;
    }
}

// cpu_offload on CUDA: the shards in pinned host memory, the same losses as its base strategy.
TEST(Gpu, CpuOffloadMatchesItsBaseStrategy) {
  FSDPX_NEEDS_GPUS(1);
  fsdpx::test::TempDir dir;
  const auto base = losses("--strategy full_shard --device cuda", 1, (dir.path() / "base").string());
  const auto off = losses("--strategy full_shard --device cuda --offload", 1, (dir.path() / "off").string());
  ASSERT_EQ(base.size(), off.size());
  for (size_t i = 0; i < base.size(); ++i) EXPECT_NEAR(off[i], base[i], 1e-6 * std::abs(base[i])) << i;
}

// fsdpx-train on CUDA: the CPU run's losses within fp32 rounding (NCCL at one rank; two ranks
// sharing the GPU over Gloo), and a checkpoint saved on the GPU resumes on the CPU with the
// uninterrupted run's losses.
TEST(Gpu, TrainerOnCudaMatchesTheCpuAndItsCheckpointsResumeAnywhere) {
  FSDPX_NEEDS_GPUS(1);
  fsdpx::test::TempDir dir;
  const std::string train =
      fsdpx::test::train() +
      " --model.size tiny --data.name synthetic --log-every 1 --steps 4 --checkpoint.name sharded ";
  auto step_losses = [&](const std::string& out) {
    std::vector<double> v;
    for (const auto& j : fsdpx::test::step_metrics(out)) v.push_back(j["loss"].get<double>());
    return v;
  };
  for (const auto& [n, backend] : {std::pair<int, const char*>{1, "default"}, {2, "gloo"}}) {
    const std::string ranks = "--nproc-per-node " + std::to_string(n) + " ";
    const std::string cpu = (dir.path() / ("cpu" + std::to_string(n))).string(),
                      gpu = (dir.path() / ("gpu" + std::to_string(n))).string();
    auto a = fsdpx::test::run_command(train + ranks + "--device cpu --out " + cpu, 600);
    auto b = fsdpx::test::run_command(
        train + ranks + "--save-every 2 --device cuda --backend " + backend + " --out " + gpu, 600);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(b.exit_code, 0) << b.err;
    const auto lc = step_losses(cpu), lg = step_losses(gpu);
    ASSERT_EQ(lc.size(), lg.size());
    for (size_t i = 0; i < lc.size(); ++i)
      EXPECT_NEAR(lg[i], lc[i], 1e-4 * std::abs(lc[i])) << n << " rank(s), step " << i;
    const std::string resumed = (dir.path() / ("resumed" + std::to_string(n))).string();
    auto c = fsdpx::test::run_command(
        train + ranks + "--device cpu --resume " + gpu + "/checkpoints/step-00000002 --out " + resumed, 600);
    ASSERT_EQ(c.exit_code, 0) << c.err;
    const auto lr = step_losses(resumed);
    ASSERT_EQ(lr.size(), 2u);
    EXPECT_NEAR(lr[1], lg[3], 1e-4 * std::abs(lg[3]));
  }
}

// The CUDA probe with a GPU: the device runtime opens and an NCCL group of one rank all-reduces.
TEST(Gpu, ProbeOpensTheDeviceAndNcclAtOneRank) {
  FSDPX_NEEDS_GPUS(1);
  auto r = fsdpx::test::run_command("env LD_BIND_NOW=1 " +
                                    (fsdpx::test::build_dir() / "tests" / "cuda_probe").string() + " --expect-gpu");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("nccl all-reduce of 1 rank: ok"), std::string::npos) << r.out;
}

}  // namespace
