// The device libraries libfsdpx loads when a run asks for them, from beside libfsdpx (or from the
// path in an environment variable): libfsdpx_sim.so (devices/sim) for --device sim, and, in a
// CUDA build, libfsdpx_cuda.so (devices/cuda) for --device cuda, NCCL and the CUDA facts of
// `fsdpx-plugins info`. libfsdpx itself links LibTorch's CPU libraries only.
#pragma once

namespace fsdpx {

// Each loads its library once. They throw fsdpx::Error naming the path and the loader's reason
// when it does not load (load_cuda: also when this fsdpx was built without CUDA).
void load_sim();
void load_cuda();

// The address of libfsdpx_cuda's C function `name` (load_cuda first); throws fsdpx::Error when the
// library has no such function (it is older than this libfsdpx).
void* cuda_function(const char* name);

}  // namespace fsdpx
