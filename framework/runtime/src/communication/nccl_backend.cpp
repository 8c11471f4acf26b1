// ProcessGroupNCCL, compiled into CUDA builds (FSDPX_WITH_CUDA); elsewhere a clear refusal. And
// sim's NCCL twin, in every build.
#include <dlfcn.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/c10d_backends.h"
#include "fsdpx/framework/runtime/device.h"
#include "sim_library.h"

#ifdef FSDPX_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace fsdpx {

#ifdef FSDPX_WITH_CUDA
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout, int device) {
  int count = static_cast<int>(c10::cuda::device_count());
  if (count == 0)
    throw Error("NCCL needs a GPU per rank: no GPU visible to this process; train with --device cpu, or --device sim");
  // Under `srun --gpus-per-task=1` each rank sees exactly one GPU: device 0.
  if (count == 1) device = 0;
  if (device < 0 || device >= count)
    throw Error("CUDA device " + std::to_string(device) + " (from the local rank) does not exist: " +
                std::to_string(count) + " visible; run at most one rank per GPU");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}
#else
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                    std::chrono::milliseconds, int) {
  throw Error("this fsdpx was built without CUDA, so NCCL is not available; train with --device cpu");
}
#endif

c10::intrusive_ptr<c10d::Backend> make_sim_nccl_twin(c10::intrusive_ptr<c10d::Backend> host, int local_rank) {
  load_sim();
  using MakeTwin = void* (*)(void*, int);
  static const auto make = reinterpret_cast<MakeTwin>(::dlsym(RTLD_DEFAULT, "fsdpx_sim_make_nccl_twin"));
  if (!make)
    throw Error("libfsdpx_sim.so has no NCCL twin (fsdpx_sim_make_nccl_twin): it is older than this libfsdpx; "
                "rebuild both (make build), or train with --backend gloo");
  const c10::Device device = device_for_rank("sim", local_rank);
  return c10::intrusive_ptr<c10d::Backend>::reclaim(
      static_cast<c10d::Backend*>(make(host.release(), static_cast<int>(device.index()))));
}

}  // namespace fsdpx
