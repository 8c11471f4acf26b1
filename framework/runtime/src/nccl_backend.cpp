// ProcessGroupNCCL, compiled into CUDA builds (FSDPX_WITH_CUDA); elsewhere a clear refusal.
#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/c10d_backends.h"

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

}  // namespace fsdpx
