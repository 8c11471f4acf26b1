// libfsdpx_cuda's C functions, which libfsdpx finds with dlsym once it has loaded this library
// (framework/runtime/src/device.cpp, load_cuda). Errors come back as text, not as exceptions:
// this library shares no fsdpx types with libfsdpx. LibTorch's own errors (c10::Error) pass through.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

#define FSDPX_CUDA_API extern "C" __attribute__((visibility("default")))

namespace {

thread_local std::string g_text;  // what the last call has to say, for the caller to copy

const char* said(std::string text) {
  g_text = std::move(text);
  return g_text.c_str();
}

}  // namespace

// The CUDA runtime and NCCL versions this library was compiled with ("13.0", "2.28.9").
FSDPX_CUDA_API const char* fsdpx_cuda_runtime_version() {
  return said(std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10));
}
FSDPX_CUDA_API const char* fsdpx_cuda_nccl_version() {
  return said(std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH));
}

// The GPUs the CUDA runtime sees; when it sees none, *why says why (else it is set to null).
FSDPX_CUDA_API int fsdpx_cuda_device_count(const char** why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  *why = nullptr;
  if (err == cudaSuccess) return count;
  *why = said(cudaGetErrorString(err));
  cudaGetLastError();  // clear it
  return 0;
}

// A ProcessGroupNCCL for `rank` of `size` over `store` (a c10::intrusive_ptr<c10d::Store>*), on
// GPU `device` (the local rank). Returns the c10d::Backend* with its reference, or null with
// *error saying why.
FSDPX_CUDA_API void* fsdpx_cuda_make_nccl_backend(const void* store, int rank, int size, long long timeout_ms,
                                                  int device, const char** error) {
  *error = nullptr;
  const int count = static_cast<int>(c10::cuda::device_count());
  if (count == 0) {
    *error = said("NCCL needs a GPU per rank: no GPU visible to this process; train with --device cpu, or "
                  "--device sim");
    return nullptr;
  }
  // Under `srun --gpus-per-task=1` each rank sees exactly one GPU: device 0.
  if (count == 1) device = 0;
  if (device < 0 || device >= count) {
    *error = said("CUDA device " + std::to_string(device) + " (from the local rank) does not exist: " +
                  std::to_string(count) + " visible; run at most one rank per GPU");
    return nullptr;
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  // On an NCCL error (a peer's socket closed: it died) PyTorch's default (3, SkipCleanUp) ends the
  // process from its watchdog thread, with a message that names no rank. fsdpx names the lost rank
  // itself (its peer monitor) and ends every rank with that message, so the watchdog only aborts
  // the communicators and fails the work (2, CleanUpOnly). A user's own setting stays.
  ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = std::chrono::milliseconds(timeout_ms);
  const auto& s = *static_cast<const c10::intrusive_ptr<c10d::Store>*>(store);
  c10::intrusive_ptr<c10d::Backend> backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(s, rank, size, options);
  return backend.release();
}
