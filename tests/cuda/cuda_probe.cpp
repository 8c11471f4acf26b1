// cuda_probe: the CUDA and NCCL entry points fsdpx uses, called for real. It links libfsdpx alone,
// as fsdpx-train does, so its first step loads libfsdpx_cuda.so (devices/cuda), which links
// libtorch_cuda; the loader binds every symbol that library takes from libcudart, libc10_cuda,
// libtorch_cuda and NCCL as it loads (RTLD_NOW), so a missing one is a failure here. Then it asks
// the machine: the CUDA runtime and NCCL versions fsdpx was built with, the GPUs visible, whether
// LibTorch now has CUDA (libtorch_cuda registers it as it loads), and whether a CUDA device opens
// for a rank (a device runtime: streams by role, allocator statistics, pinned host memory, the
// generator) and an NCCL group of one rank forms on it.
//
// Prints one "name: value" line per fact and exits 0 when every step either worked or refused
// with fsdpx's own error for a machine without a GPU ("no GPU visible"), 1 otherwise. With
// --expect-gpu (make gpu-check), a machine without a GPU is a failure. With --ask-libtorch-first
// it asks LibTorch about CUDA before fsdpx loads libfsdpx_cuda.so, which fixes LibTorch's answer
// at no for the process, and exits 0 when fsdpx then refuses --device cuda saying so.
#include <cstdio>
#include <cstring>
#include <string>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/ones.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/build_info.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/process_groups.h"

namespace {

// The device runtime's entry points on device 0: streams, statistics, pinned memory, generator.
void open_cuda() {
  auto device = fsdpx::open_device("cuda", 0);
  std::printf("device: %s\n", device->name().c_str());
  for (int r = 0; r < fsdpx::kStreamRoles; ++r)
    std::printf("stream %s: %s\n", fsdpx::stream_role_name(static_cast<fsdpx::StreamRole>(r)),
                c10::str(device->stream(static_cast<fsdpx::StreamRole>(r))).c_str());
  at::Tensor t = at::ones({1 << 20}, at::TensorOptions().device(device->device()));
  const fsdpx::MemoryStats m = device->memory_stats();
  std::printf("allocated: %lld bytes (peak %lld), reserved %lld\n", static_cast<long long>(m.allocated),
              static_cast<long long>(m.peak_allocated), static_cast<long long>(m.reserved));
  at::Tensor pinned = at::empty({16}, device->host_options());
  std::printf("pinned host memory: %s\n", pinned.is_pinned() ? "yes" : "no");
  std::printf("generator state: %lld bytes\n", static_cast<long long>(device->rng_state().numel()));
  device->synchronize();
}

// An NCCL group of one rank on device 0, and one all-reduce through it.
void one_rank_nccl() {
  fsdpx::RuntimeOptions ro;
  ro.topology.world_size = ro.topology.local_world_size = 1;
  ro.topology.master_addr = "127.0.0.1";
  ro.device = fsdpx::DeviceKind::Cuda;
  auto groups = fsdpx::ProcessGroups::create(ro);
  at::Tensor t = at::ones({8}, at::TensorOptions().device(c10::kCUDA));
  groups->world()->all_reduce(t, fsdpx::ReduceOp::Sum).wait();
  std::printf("nccl all-reduce of 1 rank: %s\n", t.sum().item<float>() == 8.f ? "ok" : "wrong result");
}

}  // namespace

int main(int argc, char** argv) {
  const bool expect_gpu = argc > 1 && std::strcmp(argv[1], "--expect-gpu") == 0;
  if (argc > 1 && std::strcmp(argv[1], "--ask-libtorch-first") == 0) {
    std::printf("libtorch asked first: has cuda %s\n", at::hasCUDA() ? "yes" : "no");
    try {
      fsdpx::check_device("cuda", 1, false);
    } catch (const fsdpx::Error& e) {
      std::printf("refused: %s\n", e.what());
      return std::strstr(e.what(), "was asked about CUDA before libfsdpx_cuda.so") ? 0 : 1;
    }
    std::printf("--device cuda: not refused\n");
    return 1;
  }
  const fsdpx::BuildInfo b = fsdpx::build_info();
  std::printf("cuda build: %s\ncuda runtime: %s\nnccl: %s\ngpus visible: %d%s%s\n", b.cuda_build ? "yes" : "no",
              b.cuda_version.c_str(), b.nccl_version.c_str(), b.cuda_devices, b.cuda_status.empty() ? "" : " - ",
              b.cuda_status.c_str());
  if (!b.cuda_build) return 1;
  // CUDA's hooks in LibTorch: the real ones (libtorch_cuda loaded with libfsdpx_cuda) say they have
  // the CUDA runtime, GPU or not; the stand-in LibTorch keeps without libtorch_cuda says no.
  const bool registered = at::detail::getCUDAHooks().hasCUDART();
  std::printf("libtorch cuda: %s\n", registered ? "registered" : "NOT registered");
  if (!registered) return 1;
  int failures = 0;
  for (auto [what, step] : {std::pair<const char*, void (*)()>{"device", &open_cuda}, {"nccl", &one_rank_nccl}}) {
    try {
      step();
    } catch (const std::exception& e) {
      const bool no_gpu = std::string(e.what()).find("no GPU visible") != std::string::npos;
      std::printf("%s: %s (%s)\n", what, no_gpu ? "refused: no GPU here" : "FAILED", e.what());
      failures += !no_gpu || expect_gpu;
    }
  }
  return failures == 0 ? 0 : 1;
}
