// CUDA and NCCL facts, compiled only into CUDA builds (FSDPX_WITH_CUDA).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "fsdpx/framework/runtime/build_info.h"

namespace fsdpx {

void fill_cuda_info(BuildInfo& info) {
  info.cuda_build = true;
  info.cuda_version = std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  info.nccl_version = std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                      std::to_string(NCCL_PATCH);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.cuda_devices = 0;
    info.cuda_status = cudaGetErrorString(err);
    cudaGetLastError();  // clear it
  } else {
    info.cuda_devices = count;
  }
}

}  // namespace fsdpx
