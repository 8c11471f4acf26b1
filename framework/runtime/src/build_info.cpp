#include "fsdpx/framework/runtime/build_info.h"

#include <torch/version.h>

#include "fsdpx/abi.h"
#include "fsdpx/error.h"
#include "fsdpx/version.h"
#include "device_libraries.h"

namespace fsdpx {

#ifdef FSDPX_WITH_CUDA
namespace {

// From libfsdpx_cuda.so, which this loads (and with it LibTorch's CUDA libraries).
void fill_cuda_info(BuildInfo& info) {
  info.cuda_build = true;
  try {
    using Text = const char* (*)();
    info.cuda_version = reinterpret_cast<Text>(cuda_function("fsdpx_cuda_runtime_version"))();
    info.nccl_version = reinterpret_cast<Text>(cuda_function("fsdpx_cuda_nccl_version"))();
    const char* why = nullptr;
    info.cuda_devices = reinterpret_cast<int (*)(const char**)>(cuda_function("fsdpx_cuda_device_count"))(&why);
    if (why) info.cuda_status = why;
  } catch (const Error& e) {
    info.cuda_status = e.what();
  }
}

}  // namespace
#endif

BuildInfo build_info() {
  BuildInfo info;
  info.fsdpx_version = FSDPX_VERSION;
  info.abi_major = FSDPX_ABI_MAJOR;
  info.abi_minor = FSDPX_ABI_MINOR;
  info.torch_version = TORCH_VERSION;
#ifdef _GLIBCXX_USE_CXX11_ABI
  info.cxx11_abi = _GLIBCXX_USE_CXX11_ABI;
#endif
#ifdef FSDPX_WITH_CUDA
  fill_cuda_info(info);
#else
  info.cuda_status = "this fsdpx was built without CUDA";
#endif
  return info;
}

}  // namespace fsdpx
