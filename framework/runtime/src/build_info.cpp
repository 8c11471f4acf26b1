#include "fsdpx/framework/runtime/build_info.h"

#include <torch/version.h>

#include "fsdpx/abi.h"
#include "fsdpx/version.h"

namespace fsdpx {

#ifdef FSDPX_WITH_CUDA
void fill_cuda_info(BuildInfo& info);  // cuda_info.cpp
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
