// What this libfsdpx was built with and what the machine offers, for `fsdpx-plugins info`.
#pragma once

#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

struct BuildInfo {
  std::string fsdpx_version;
  int abi_major = 0;
  int abi_minor = 0;
  std::string torch_version;
  int cxx11_abi = 0;
  bool cuda_build = false;      // compiled with CUDA and NCCL support
  std::string cuda_version;     // of the toolkit fsdpx was compiled with, e.g. "13.0"
  std::string nccl_version;     // of the NCCL headers fsdpx was compiled with, e.g. "2.28.9"
  int cuda_devices = 0;         // visible now
  std::string cuda_status;      // why there are none, when there are none
};

FSDPX_API BuildInfo build_info();

}  // namespace fsdpx
