#include "activation_offload.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/framework/runtime/device.h"

namespace fsdpx {

bool offloadable(const at::Tensor& input) {
  return input.defined() && input.requires_grad() && at::isFloatingType(input.scalar_type());
}

std::vector<at::Tensor> offload_inputs(const DeviceRuntime& dev, const std::vector<at::Tensor>& inputs) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> host(inputs.size());
  dev.wait_stream(StreamRole::Offload, StreamRole::Compute);  // the inputs are written
  OnStream on(dev, StreamRole::Offload);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!offloadable(inputs[i])) continue;
    host[i] = at::empty(inputs[i].sizes(), dev.host_options().dtype(inputs[i].scalar_type()));
    host[i].copy_(inputs[i].detach(), /*non_blocking=*/true);
  }
  return host;
}

void load_inputs(const DeviceRuntime& dev, OffloadedInputs& o) {
  if (o.loading || !o.any()) return;
  at::NoGradGuard no_grad;
  o.loading = true;
  o.loaded.assign(o.host.size(), at::Tensor());
  {
    OnStream on(dev, StreamRole::Compute);  // allocated, and later freed, by the compute stream
    for (size_t i = 0; i < o.host.size(); ++i)
      if (o.host[i].defined())
        o.loaded[i] =
            at::empty(o.host[i].sizes(), at::TensorOptions().dtype(o.host[i].scalar_type()).device(dev.device()));
  }
  dev.wait_stream(StreamRole::Offload, StreamRole::Compute);  // the buffers' earlier uses are done
  OnStream on(dev, StreamRole::Offload);
  for (size_t i = 0; i < o.host.size(); ++i)
    if (o.host[i].defined()) o.loaded[i].copy_(o.host[i], /*non_blocking=*/true);
}

std::vector<at::Tensor> loaded_inputs(const DeviceRuntime& dev, OffloadedInputs& o) {
  load_inputs(dev, o);
  dev.wait_stream(StreamRole::Compute, StreamRole::Offload);
  return o.loaded;
}

}  // namespace fsdpx
