// The simulated accelerator "sim" (devices/sim, PrivateUse1) on its own: registration, streams
// and events, copies and pinned memory, device memory that host code cannot read, allocator
// statistics and the memory budget, storage resize, generators, and kernels that give the CPU's
// results bit for bit (they are the CPU's, through the fallback).
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>
#include <map>
#include <ostream>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>

#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/step_clock.h"
#include "fsdpx/optimizer.h"
#include "fsdpx/sim/sim.h"
#include "test_paths.h"

namespace sim = fsdpx::sim;

namespace {

const c10::Device kSim0(c10::DeviceType::PrivateUse1, 0);
const c10::Device kSim1(c10::DeviceType::PrivateUse1, 1);
constexpr size_t kAgg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.cpu(), y = b.cpu();
  return x.sizes() == y.sizes() && x.dtype() == y.dtype() && at::equal(x, y);
}

// fn in a forked child: its wait status. (fork, not threads: the child may die of SIGSEGV.)
int in_child(const std::function<void()>& fn) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(Sim, RegisteredAsPrivateUse1WithStreamsAndEvents) {
  EXPECT_EQ(c10::get_privateuse1_backend(), "sim");
  EXPECT_EQ(c10::Device("sim:1"), kSim1);
  EXPECT_EQ(at::getAccelerator(false), c10::DeviceType::PrivateUse1);
  EXPECT_EQ(at::accelerator::deviceCount(), sim::device_count());
  {
    c10::DeviceGuard g(kSim1);
    EXPECT_EQ(at::empty({4}, at::TensorOptions().device(c10::DeviceType::PrivateUse1)).device(), kSim1);
  }
  c10::impl::VirtualGuardImpl vg(c10::DeviceType::PrivateUse1);
  const c10::Stream def = vg.getDefaultStream(kSim0), s1 = vg.getNewStream(kSim0),
                    s2 = vg.getStreamFromGlobalPool(kSim0);
  EXPECT_TRUE(def.id() == 0 && s1.id() != 0 && s2.id() != 0 && s1 != s2);
  {
    c10::StreamGuard sg(s1);
    EXPECT_EQ(vg.getStream(kSim0), s1);
    bool other_thread_default = false;  // the current stream is per thread, as on CUDA
    std::thread([&] { other_thread_default = vg.getStream(kSim0).id() == 0; }).join();
    EXPECT_TRUE(other_thread_default);
  }
  EXPECT_EQ(vg.getStream(kSim0), def);
  c10::Event ev(c10::DeviceType::PrivateUse1);
  ev.record(s1);
  ev.block(s2);
  EXPECT_TRUE(ev.query());
  ev.synchronize();
  c10::Event t0(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  c10::Event t1(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  t0.record(def);
  t1.record(def);
  EXPECT_GE(t0.elapsedTime(t1), 0.0);
  EXPECT_THROW((void)ev.elapsedTime(t1), c10::Error);  // no timing asked, as on CUDA
}

// The stream-order check: a kernel that would race on a GPU is an error on sim, naming the
// streams; the same kernel after the event a GPU needs, or after the host read the result back,
// passes.
TEST(Sim, StreamOrderCheckFindsKernelsThatWouldRace) {
  c10::impl::VirtualGuardImpl vg(c10::DeviceType::PrivateUse1);
  c10::DeviceGuard dg(kSim1);
  const c10::Stream def = vg.getDefaultStream(kSim1), side = vg.getNewStream(kSim1);
  const auto opts = at::TensorOptions().device(kSim1);
  const size_t before = sim::stream_hazards();
  at::Tensor a = at::ones({64}, opts);  // written on the default stream, read on another unordered
  const std::string race = fsdpx::test::torch_error_of([&] {
    c10::StreamGuard g(side);
    (void)(a * 2);
  });
  EXPECT_NE(race.find("sim stream-order hazard: a kernel on stream " + std::to_string(side.id())), std::string::npos)
      << race;
  EXPECT_NE(race.find("that stream 0 (the default stream) of sim:1 used last"), std::string::npos) << race;
  at::Tensor b = at::ones({64}, opts), doubled, d, e;
  c10::Event written(c10::DeviceType::PrivateUse1);
  written.record(def);
  written.block(side);
  {
    c10::StreamGuard g(side);
    EXPECT_EQ(fsdpx::test::torch_error_of([&] { doubled = b * 2; }), "(no error)");
    d = doubled * 3;
  }
  EXPECT_NE(fsdpx::test::torch_error_of([&] { (void)(d + 1); }),
            "(no error)");  // the side stream's result, not waited for
  {
    c10::StreamGuard g(side);
    e = doubled * 3;
    EXPECT_EQ(e.cpu()[0].item<float>(), 6.0f);  // a blocking copy: the host waited for the stream
  }
  EXPECT_EQ(fsdpx::test::torch_error_of([&] { (void)(e + 1); }), "(no error)");
  EXPECT_EQ(sim::stream_hazards(), before + 2);
  EXPECT_NE(sim::first_stream_hazard(), "(no error)");
  vg.synchronizeDevice(kSim1.index());  // the host waits for everything: what is freed next is safe
}

// Memory used on another stream than its allocation's, freed before that stream was waited for,
// is an error at the next allocation (CUDA's caching allocator may hand it out again at once);
// after an event, a host wait, or record_stream, it is not.
TEST(Sim, StreamOrderCheckFindsFreesThatWouldRace) {
  c10::impl::VirtualGuardImpl vg(c10::DeviceType::PrivateUse1);
  c10::DeviceGuard dg(kSim1);
  const c10::Stream def = vg.getDefaultStream(kSim1), side = vg.getNewStream(kSim1);
  const auto opts = at::TensorOptions().device(kSim1);
  for (int way = 0; way < 4; ++way) {
    at::Tensor c = at::ones({64}, opts), doubled;
    c10::Event e1(c10::DeviceType::PrivateUse1);
    e1.record(def);
    e1.block(side);
    {
      c10::StreamGuard g(side);
      doubled = c * 2;
    }
    if (way == 1) {
      c10::Event used(c10::DeviceType::PrivateUse1);
      used.record(side);
      used.block(def);
    } else if (way == 2) {
      vg.synchronizeStream(side);
    } else if (way == 3) {
      c.record_stream(side);
    }
    c = at::Tensor();
    const std::string freed = fsdpx::test::torch_error_of([&] { (void)at::empty({8}, opts); });
    if (way == 0)
      EXPECT_NE(freed.find("are freed while stream " + std::to_string(side.id()) + " may still use them"),
                std::string::npos)
          << freed;
    else
      EXPECT_EQ(freed, "(no error)") << "way " << way;
    vg.synchronizeDevice(kSim1.index());
  }
}

TEST(Sim, CopiesConvertAndPinnedMemoryIsPinned) {
  at::Tensor c = at::randn({17, 33}, at::detail::createCPUGenerator(1));
  at::Tensor s = c.to(kSim0);
  EXPECT_TRUE(bit_equal(s, c));
  EXPECT_TRUE(bit_equal(s.to(at::kDouble), c.to(at::kDouble)));
  EXPECT_TRUE(bit_equal(c.to(kSim0, at::kBFloat16), c.to(at::kBFloat16)));
  EXPECT_TRUE(bit_equal(s.t().contiguous(), c.t().contiguous()));
  EXPECT_TRUE(bit_equal(s.to(kSim1), c));
  at::Tensor o = at::arange(10, at::kFloat).to(kSim0);  // overlapping copy within one storage
  o.slice(0, 1, 10).copy_(o.slice(0, 0, 9).clone());
  EXPECT_TRUE(bit_equal(o, at::cat({at::zeros({1}), at::arange(9, at::kFloat)})));
  EXPECT_EQ(s[3][4].item<float>(), c[3][4].item<float>());
  at::Tensor base = at::zeros({4, 6}, s.options());  // in place on a view: written back into the base
  base.slice(1, 1, 6, 2).add_(1);
  EXPECT_EQ(base.sum().item<float>(), 12.f);
  // Pinned host memory. Tensor::pin_memory() and is_pinned() ask the current accelerator, which is
  // sim whenever it is registered: sim's pinned memory. at::empty(pinned_memory(true))
  // (DeviceRuntime::host_options) would ask CUDA first (ATen's GetCPUAllocatorMaybePinned), but a
  // sim run, like this test, never loads LibTorch's CUDA libraries (only --device cuda loads
  // libfsdpx_cuda.so), so it is sim's too, GPU or not.
  const auto p0 = sim::pinned_stats();
  auto sim_bytes = [&] { return sim::pinned_stats().current_bytes - p0.current_bytes; };
  at::Tensor own = c.pin_memory();
  EXPECT_TRUE(own.is_pinned());
  EXPECT_TRUE(own.slice(0, 5).is_pinned());
  EXPECT_FALSE(c.is_pinned());
  EXPECT_TRUE(bit_equal(own, c));
  EXPECT_EQ(sim_bytes(), 17 * 33 * 4);
  at::Tensor pinned = at::empty({1024}, at::TensorOptions().pinned_memory(true));
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_TRUE(pinned.slice(0, 100).is_pinned());
  EXPECT_EQ(sim_bytes(), 17 * 33 * 4 + 1024 * 4);
  pinned.copy_(at::arange(1024, at::kFloat).to(kSim0), /*non_blocking=*/true);
  EXPECT_TRUE(bit_equal(pinned, at::arange(1024, at::kFloat)));
  pinned = at::Tensor();
  own = at::Tensor();
  EXPECT_EQ(sim_bytes(), 0);
}

// Device memory is mapped without access for host code: reading a sim tensor's data_ptr on the
// host faults, as on a GPU. The device's own kernels reach it through an alias.
TEST(Sim, HostCodeCannotReadDeviceMemory) {
  if (sim::protection_mode() == sim::Protection::None) GTEST_SKIP() << "FSDPX_SIM_PROTECT=none";
  at::Tensor s = at::ones({1024}).to(kSim0);
  const float* p = static_cast<const float*>(s.const_data_ptr());
  const int st = in_child([&] {
    volatile float x = p[10];
    (void)x;
  });
  // Killed by SIGSEGV; under AddressSanitizer its handler reports the SEGV and exits non-zero.
  EXPECT_TRUE((WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV) || (WIFEXITED(st) && WEXITSTATUS(st) != 0)) << st;
  sim::DeviceAccess acc;
  EXPECT_EQ(static_cast<float*>(acc.host(p))[10], 1.0f);
  EXPECT_EQ(s.sum().item<float>(), 1024.f);
}

TEST(Sim, AllocatorStatisticsAndTheBudget) {
  sim::empty_cache();
  sim::reset_peak_stats(0);
  const auto before = sim::device_stats(0);
  {
    at::Tensor a = at::empty({1 << 20}, at::TensorOptions().device(kSim0));  // 4 MiB
    const auto during = sim::device_stats(0);
    EXPECT_EQ(during.allocated_bytes[kAgg].current - before.allocated_bytes[kAgg].current, 4 << 20);
    EXPECT_GE(during.reserved_bytes[kAgg].current, during.allocated_bytes[kAgg].current);
  }
  const auto after = sim::device_stats(0);
  EXPECT_EQ(after.allocated_bytes[kAgg].current, before.allocated_bytes[kAgg].current);
  EXPECT_EQ(after.allocated_bytes[kAgg].peak - before.allocated_bytes[kAgg].current, 4 << 20);
  sim::reset_peak_stats(0);
  EXPECT_EQ(sim::device_stats(0).allocated_bytes[kAgg].peak, after.allocated_bytes[kAgg].current);
  // A budget: an allocation past it is LibTorch's OutOfMemoryError naming the device, the bytes
  // asked for and the bytes left.
  const size_t used = static_cast<size_t>(sim::device_stats(1).reserved_bytes[kAgg].current);
  sim::set_memory_budget(1, used + (8 << 20));
  at::Tensor fits = at::empty({1 << 20}, at::TensorOptions().device(kSim1));
  try {
    (void)at::empty({4 << 20}, at::TensorOptions().device(kSim1));
    ADD_FAILURE() << "no error past the budget";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("sim out of memory on sim:1: tried to allocate 16.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("left"), std::string::npos) << m;
  }
  sim::set_memory_budget(1, 0);
}

// resize_bytes_sim frees a storage's bytes in place and gives them back: the views over it stay
// the same objects (FSDP's unsharded parameters), and the statistics follow.
TEST(Sim, StorageResizeFreesAndRegrows) {
  at::Tensor flat = at::arange(1024, at::kFloat).to(kSim0);
  at::Tensor view = flat.narrow(0, 512, 512);
  const int64_t live = sim::device_stats(0).allocated_bytes[kAgg].current;
  sim::resize_bytes_sim(flat.storage().unsafeGetStorageImpl(), 0);
  EXPECT_EQ(sim::device_stats(0).allocated_bytes[kAgg].current, live - 4096);
  sim::resize_bytes_sim(flat.storage().unsafeGetStorageImpl(), 4096, /*copy_old=*/false);
  flat.copy_(at::arange(1024, at::kFloat).mul(2));
  EXPECT_TRUE(bit_equal(view, at::arange(512, 1024, at::kFloat).mul(2)));
  EXPECT_EQ(flat.device(), kSim0);
}

// The kernels are the CPU's, through the fallback: forward and backward of embedding, linear,
// GELU, causal attention, softmax and cross-entropy give the CPU's gradients bit for bit, and
// fused AdamW and SGD steps the CPU's parameters.
TEST(Sim, ForwardBackwardAndFusedOptimizersEqualTheCpuBitForBit) {
  auto run = [](c10::Device d) {
    at::Generator gen = at::detail::createCPUGenerator(1234);
    auto r = [&](std::vector<int64_t> s) { return (at::randn(s, gen) * 0.2).to(d).requires_grad_(true); };
    at::Tensor emb = r({50, 32}), w1 = r({64, 32}), w2 = r({32, 64}), wq = r({32, 32}), wo = r({32, 32});
    at::Tensor tokens = at::randint(0, 50, {3, 8}, gen).to(d), targets = at::randint(0, 50, {3, 8}, gen).to(d);
    at::Tensor x = at::embedding(emb, tokens);
    x = x + at::linear(at::gelu(at::linear(x, w1)), w2);
    at::Tensor h = at::linear(x, wq).view({3, 8, 4, 8}).transpose(1, 2);
    at::Tensor a = at::scaled_dot_product_attention(h, h, h, {}, 0.0, /*is_causal=*/true);
    x = x + at::linear(a.transpose(1, 2).reshape({3, 8, 32}), wo);
    at::Tensor loss = at::cross_entropy_loss(at::matmul(x, emb.t()).reshape({24, 50}), targets.reshape({24}));
    loss.backward();
    std::vector<at::Tensor> params{emb, w1, w2, wq, wo}, grads, m, v, steps;
    for (auto& p : params) {
      grads.push_back(p.grad());
      m.push_back(at::zeros_like(p));
      v.push_back(at::zeros_like(p));
      steps.push_back(at::ones({}, p.options().dtype(at::kFloat)));  // the kernel reads the step taken
    }
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> flat(params.begin(), params.end());
    at::_fused_adamw_(flat, grads, m, v, {}, steps, 1e-3, 0.9, 0.999, 0.01, 1e-8, false, false);
    at::_fused_sgd_(flat, grads, std::vector<at::Tensor>{}, 0.0, 0.0, 0.1, 0.0, false, false, true);
    std::vector<at::Tensor> out{loss.detach()};
    for (auto& p : params) out.push_back(p.detach().cpu());
    for (auto& g : grads) out.push_back(g.cpu());
    return out;
  };
  const auto cpu = run(at::kCPU), dev = run(kSim0);
  ASSERT_EQ(cpu.size(), dev.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(bit_equal(cpu[i], dev[i])) << "tensor " << i;
}

// A sim device's generator draws what a CPU generator of the same seed draws, and its state can
// be saved and replayed (activation checkpointing); it is a stream apart from the CPU's.
TEST(Sim, GeneratorsReplayAndMatchTheCpu) {
  at::Generator g = sim::new_generator(0);
  g.set_current_seed(42);
  at::Generator c = at::detail::createCPUGenerator(42);
  at::Tensor a = at::empty({100}, at::TensorOptions().device(kSim0));
  a.normal_(0, 1, g);
  at::Tensor b = at::empty({100});
  b.normal_(0, 1, c);
  EXPECT_TRUE(bit_equal(a, b));
  const at::Tensor state = g.get_state();
  at::Tensor first = at::empty({10}, a.options()).uniform_(0, 1, g);
  g.set_state(state);
  EXPECT_TRUE(bit_equal(at::empty({10}, a.options()).uniform_(0, 1, g), first));
}

// The optimizer plugins on device shards: adamw and sgd through ATen's fused kernels (the CPU's,
// here through the fallback: the same bits), anyprecision_adamw through its tensor-op form (each
// operand widened, updated, rounded once), within a few ulps of its single CPU pass (measured
// 2.4e-7 over 20 steps, with fp32 or the default bf16 variance).
TEST(SimOptimizers, StepOnTheDeviceAsOnTheCpu) {
  fsdpx::PluginHost host;
  for (const char* p : {"optimizer_adamw", "optimizer_anyprecision_adamw", "optimizer_sgd"})
    host.load_file(fsdpx::test::plugin_dir() / (std::string(p) + ".so"));
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> cases{
      {"adamw", {{"weight_decay", "0.1"}}}, {"sgd", {{"momentum", "0.9"}}},
      {"anyprecision_adamw", {{"variance_dtype", "fp32"}, {"weight_decay", "0.1"}}}, {"anyprecision_adamw", {}}};
  for (const auto& [name, options] : cases) {
    auto cpu = host.create<fsdpx::Optimizer>(name, options), dev = host.create<fsdpx::Optimizer>(name, options);
    at::Generator gen = at::detail::createCPUGenerator(11);
    at::Tensor base = at::randn({70, 37}, gen);
    at::Tensor a = base.clone().requires_grad_(true), b = base.to(kSim0).requires_grad_(true);
    cpu->init({{"w", a}});
    dev->init({{"w", b}});
    double worst = 0;
    for (int step = 0; step < 20; ++step) {
      at::Tensor g = at::randn({70, 37}, gen);
      a.mutable_grad() = g.clone();
      b.mutable_grad() = g.to(kSim0);
      cpu->step(0.01);
      dev->step(0.01);
      worst = std::max(worst, (a - b.cpu()).abs().max().item<double>());
    }
    EXPECT_EQ(b.device(), kSim0);
    const bool fused = name != "anyprecision_adamw";
    std::printf("%s on sim vs the CPU, 20 steps: max |diff| %.3g\n", name.c_str(), worst);
    if (fused) EXPECT_EQ(worst, 0.0) << name;
    else EXPECT_LT(worst, 1e-6) << name;
  }
}

// Collectives on sim tensors at 2 and 4 ranks, on sim's NCCL twin (the default) and staged through
// host memory and Gloo (--backend gloo): every collective of the CPU's test, results back on the
// device; metadata over the control group stays on the CPU.
TEST(SimCollectives, EveryCollectiveOnTheNcclTwinAndStagedThroughTheHost) {
  const std::string worker = fsdpx::test::comm_worker();
  for (const char* backend : {"default", "gloo"}) {
    for (int n : {2, 4}) {
      auto r = fsdpx::test::run_command("timeout 300 " + worker + " --nproc-per-node " + std::to_string(n) +
                                        " --scenario collectives --device sim --backend " + backend);
      EXPECT_EQ(r.exit_code, 0) << backend << "\n" << r.out << r.err;
      EXPECT_NE(r.out.find("collectives ok on sim:" + std::to_string(n - 1)), std::string::npos)
          << backend << "\n" << r.out << r.err;
    }
  }
}

// Each of NCCL's rules that the twin keeps, broken on purpose at 2 ranks (tests/workers/comm_worker
// --scenario nccl-rules), is refused with the error NCCL's class of failure gives: a host tensor or
// another device's (c10::ValueError at issue, as ProcessGroupNCCL's), ranks disagreeing on the
// element count or dtype (c10::DistBackendError at the wait, on every rank), a kernel on a
// collective's buffer before its wait, a buffer freed before the wait, and a stream that did not
// wait for the one that waited (sim's stream-order check). Kept, the same collectives pass.
TEST(SimCollectives, TheNcclTwinRefusesEachBrokenRule) {
  const std::string worker = fsdpx::test::comm_worker();
  auto r = fsdpx::test::run_command("timeout 300 " + worker + " --nproc-per-node 2 --scenario nccl-rules --device sim");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* rule : {"host-tensor", "other-device", "count-mismatch", "dtype-mismatch", "touch-before-wait",
                           "free-before-wait", "wait-orders-the-waiter-only"}) {
    const std::string line = std::string("rule ") + rule + " fired: ";
    size_t count = 0;
    for (size_t at = r.out.find(line); at != std::string::npos; at = r.out.find(line, at + 1)) ++count;
    EXPECT_EQ(count, 2u) << rule << " (once per rank)\n" << r.out << r.err;
  }
  EXPECT_NE(r.out.find("Tensors must be CUDA and dense"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0: all_gather of 1000 Float elements into 2000; rank 1: all_gather of 999 Float"),
            std::string::npos) << r.out;
  size_t kept = 0;
  for (size_t at = r.out.find("rules kept: no error"); at != std::string::npos; at = r.out.find("rules kept", at + 1))
    ++kept;
  EXPECT_EQ(kept, 2u) << r.out << r.err;
}

// The sharding engine on sim, every strategy, against the same run on the CPU (tests/workers/
// engine_worker: gpt tiny, 2 SGD steps): the losses and every parameter afterwards byte for byte.
// The kernels are the CPU's (sim routes every op to them, on the same layouts), so any difference
// is a bug in the device path: placement, offload copies, storage resize. Beyond one rank, the
// collectives run on sim's NCCL twin, on its stream, ordered by FSDP2's role streams (`streams`
// did work on sim:0 in all): sim's stream-order check finds no hazard.
struct DeviceRun {
  std::string name, args;
  std::vector<int> ranks;
  int streams;  // at least this many streams of sim:0 did work, at 2 ranks and more
};

// The streams of a sim stream report (fsdpx_sim_stream_report) that did work on sim:0.
int streams_used(const std::string& report) {
  int n = 0;
  for (size_t at = report.find("sim:0 stream "); at != std::string::npos; at = report.find("sim:0 stream ", at + 1))
    ++n;
  return n;
}

void PrintTo(const DeviceRun& r, std::ostream* os) { *os << r.name; }

class SimEngine : public ::testing::TestWithParam<DeviceRun> {};

TEST_P(SimEngine, LossesAndWeightsEqualTheCpuBitForBit) {
  const DeviceRun& run = GetParam();
  fsdpx::test::TempDir dir;
  const std::string worker = fsdpx::test::engine_worker();
  for (int n : run.ranks) {
    std::map<std::string, std::string> files;
    for (const char* device : {"cpu", "sim"}) {
      const std::string out = (dir.path() / (std::string(device) + std::to_string(n))).string();
      auto r = fsdpx::test::run_command("timeout 300 " + worker + " --nproc-per-node " + std::to_string(n) +
                                        " --steps 2 --device " + device + " " + run.args + " --out " + out);
      ASSERT_EQ(r.exit_code, 0) << device << " " << n << "\n" << r.out << r.err;
      files[std::string(device) + ".losses"] = fsdpx::test::read_file(out + ".losses");
      files[std::string(device) + ".params"] = fsdpx::test::read_file(out + ".params");
    }
    EXPECT_FALSE(files["cpu.losses"].empty());
    EXPECT_EQ(files["sim.losses"], files["cpu.losses"]) << run.name << " at " << n << " ranks";
    EXPECT_TRUE(files["sim.params"] == files["cpu.params"]) << run.name << " at " << n << " ranks: the weights differ";
    const std::string streams =
        fsdpx::test::read_file((dir.path() / ("sim" + std::to_string(n) + ".streams.0")).string());
    EXPECT_NE(streams.find("hazards 0\n"), std::string::npos) << streams;
    EXPECT_GE(streams_used(streams), n > 1 ? run.streams : 1) << streams;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, SimEngine,
    // Streams that ran kernels: the default one, and the NCCL twin's stream of each group the
    // engine uses (the collectives read and write there; the all-gather, reduce-scatter and
    // all-reduce role streams only order them); hybrid has two groups (shard and replicate),
    // offload adds the copy-in stream (the shard to the device) and the offload stream (the
    // gradient shard back), bf16 the copy-in stream (the cast).
    ::testing::Values(DeviceRun{"full_shard", "--strategy full_shard", {1, 2, 4}, 2},
                      DeviceRun{"shard_grad_op", "--strategy shard_grad_op", {2, 4}, 2},
                      DeviceRun{"no_shard", "--strategy no_shard", {2, 4}, 2},
                      DeviceRun{"hybrid_shard", "--strategy full_shard --hybrid-shard 2", {4}, 3},
                      DeviceRun{"cpu_offload", "--strategy full_shard --offload", {2, 4}, 4},
                      DeviceRun{"bf16_mixed", "--strategy full_shard --precision bf16_mixed", {2}, 3},
                      DeviceRun{"adamw_accumulation_clipping",
                                "--strategy full_shard --optimizer adamw --accum 2 --clip 0.5", {2}, 2},
                      // Every Block recomputed, its inputs to host memory and back on the offload
                      // stream (the CPU run recomputes alone: nothing to move there).
                      DeviceRun{"activation_offload",
                                "--strategy full_shard --wrap-option activation_checkpointing=true "
                                "--activation-offload --accum 2",
                                {2}, 3}),
    [](const ::testing::TestParamInfo<DeviceRun>& i) { return i.param.name; });

}  // namespace

namespace {

// The step clock's arithmetic (fsdpx/framework/runtime/step_clock.h) on the host's clock (the CPU)
// and on timing events of the compute stream (sim): a wait inside the forward is taken out of it,
// the phases add up to the step, and a wait outside a step counts nowhere. Sleeps stand for work;
// the bounds leave a margin of 100 ms for a loaded machine.
void check_step_clock(const std::string& spec) {
  using namespace std::chrono_literals;
  auto device = fsdpx::open_device(spec, 0);
  fsdpx::StepClock clock(device);
  {
    fsdpx::TimedSpan waiting_outside(&clock, fsdpx::TimedPhase::AllGatherWait);  // no step open: not counted
    std::this_thread::sleep_for(50ms);
  }
  {
    fsdpx::TimedSpan step(&clock, fsdpx::TimedPhase::Step);
    {
      fsdpx::TimedSpan forward(&clock, fsdpx::TimedPhase::Forward);
      std::this_thread::sleep_for(20ms);
      fsdpx::TimedSpan waiting(&clock, fsdpx::TimedPhase::AllGatherWait);
      std::this_thread::sleep_for(200ms);
    }
    {
      fsdpx::TimedSpan backward(&clock, fsdpx::TimedPhase::Backward);
      fsdpx::TimedSpan waiting(&clock, fsdpx::TimedPhase::ReduceScatterWait);
      std::this_thread::sleep_for(100ms);
    }
    fsdpx::TimedSpan optimizer(&clock, fsdpx::TimedPhase::Optimizer);
    std::this_thread::sleep_for(30ms);
  }
  clock.step_done();
  const fsdpx::StepBreakdown b = clock.take();
  EXPECT_EQ(b.steps, 1) << spec;
  EXPECT_GE(b.forward, 0.019) << spec;
  EXPECT_LT(b.forward, 0.120) << spec << ": the all-gather wait inside the forward was not taken out of it";
  EXPECT_GE(b.all_gather_wait, 0.199) << spec;
  EXPECT_LT(b.all_gather_wait, 0.240) << spec << ": the wait outside the step was counted";
  EXPECT_GE(b.reduce_scatter_wait, 0.099) << spec;
  EXPECT_LT(b.backward, 0.050) << spec;
  EXPECT_GE(b.optimizer, 0.029) << spec;
  EXPECT_GE(b.other, -1e-9) << spec;
  double sum = 0;
  for (double s : b.values()) sum += s;
  EXPECT_GE(sum, 0.349) << spec;
  const fsdpx::StepBreakdown again = clock.take();
  EXPECT_EQ(again.steps, 0) << spec << ": take() starts afresh";
  for (double v : again.values()) EXPECT_EQ(v, 0.0) << spec << ": take() starts afresh";
  // Steps of many marks (past the 4096 a device's clock holds before it adds them up at a step's
  // end): the same arithmetic over two steps.
  for (int step = 0; step < 2; ++step) {
    {
      fsdpx::TimedSpan whole(&clock, fsdpx::TimedPhase::Step);
      fsdpx::TimedSpan forward(&clock, fsdpx::TimedPhase::Forward);
      for (int i = 0; i < 2500; ++i) fsdpx::TimedSpan waiting(&clock, fsdpx::TimedPhase::AllGatherWait);
      std::this_thread::sleep_for(10ms);
    }
    clock.step_done();
  }
  const fsdpx::StepBreakdown many = clock.take();
  EXPECT_EQ(many.steps, 2) << spec;
  EXPECT_GE(many.forward, 0.019) << spec;
  EXPECT_GT(many.all_gather_wait, 0) << spec;
  EXPECT_GE(many.other, -1e-9) << spec;
}

TEST(StepClock, PhasesAddUpAndWaitsLeaveTheirPassOnTheCpuAndOnSim) {
  check_step_clock("cpu");
  check_step_clock("sim");
}

}  // namespace
