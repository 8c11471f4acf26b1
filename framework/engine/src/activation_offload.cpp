#include "activation_offload.h"

#include <string>

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/device.h"

namespace fsdpx {

bool moves_to_host(const at::Tensor& input, int64_t slot) {
  return slot == 0 && input.defined() && input.requires_grad() && at::isFloatingType(input.scalar_type());
}

void offload_inputs(const DeviceRuntime& dev, const std::vector<at::Tensor>& inputs, const std::vector<bool>& moves,
                    OffloadedInputs& o) {
  at::NoGradGuard no_grad;
  o.clear();
  o.host.resize(inputs.size());
  dev.wait_stream(StreamRole::Offload, StreamRole::Compute);  // the inputs are written
  OnStream on(dev, StreamRole::Offload);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!moves[i]) continue;
    o.host[i] = at::empty(inputs[i].sizes(), dev.host_options().dtype(inputs[i].scalar_type()));
    o.host[i].copy_(inputs[i].detach(), /*non_blocking=*/true);
    o.versions.push_back(torch::autograd::impl::version_counter(inputs[i]));
    o.copied_at.push_back(o.versions.back().current_version());
  }
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
  if (dev.is_cpu()) return;
  o.loaded_event = std::make_shared<c10::Event>(dev.device().type());
  o.loaded_event->record(dev.stream(StreamRole::Offload));
}

std::vector<at::Tensor> loaded_inputs(const DeviceRuntime& dev, OffloadedInputs& o, const std::string& unit) {
  for (size_t k = 0; k < o.versions.size(); ++k)
    if (o.versions[k].current_version() != o.copied_at[k])
      throw Error("unit '" + unit + "': its input was changed in place after its forward, when activation offload "
                  "had copied it to host memory, so the copy is not the input; leave the input as it is (out of "
                  "place: x = x + f(x), not x += f(x)), or take the unit out of the offloaded ones");
  load_inputs(dev, o);
  if (o.loaded_event) o.loaded_event->block(dev.stream(StreamRole::Compute));
  return o.loaded;
}

}  // namespace fsdpx
