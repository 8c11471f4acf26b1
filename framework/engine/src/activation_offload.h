// Activation offload (EngineOptions::activation_offload_units): a recomputed unit's inputs, all
// that its Recompute function keeps for backward, go to host memory on the offload stream during
// forward and come back, one unit ahead, before its backward.
//
// The stream protocol, without record_stream: every device buffer is allocated on the compute
// stream, and the compute stream waits for the offload stream before it frees one or reads one
// the offload stream wrote. A copy to the host reads a source the compute stream wrote: the
// offload stream waits for the compute stream first, and the source is kept (the engine's
// `offloading`) until the next unit's inputs leave or the forward ends, when the compute stream
// waits for the copy and lets it go. A copy back writes into a buffer the compute stream
// allocated just before; the compute stream waits for it before the recompute reads it.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace fsdpx {

class DeviceRuntime;

// What one unit's forward moved to host memory, and what came back for its backward.
struct OffloadedInputs {
  std::vector<at::Tensor> host;    // per input the Recompute function keeps: its host copy, or undefined
  std::vector<at::Tensor> loaded;  // after load_inputs: the device copies, undefined where kept
  bool loading = false;
  bool any() const { return !host.empty(); }
  void clear() {
    host.clear();
    loaded.clear();
    loading = false;
  }
};

// Whether the input moves: an activation flowing through the model (floating point, needing a
// gradient). The rest, such as masks and positions shared by every layer, stays where it is.
bool offloadable(const at::Tensor& input);

// Copies the offloadable `inputs` to host memory on the offload stream, after the compute stream's
// work so far. Returns, per input, its host copy or undefined. The caller keeps the sources until
// the compute stream has waited for the offload stream.
std::vector<at::Tensor> offload_inputs(const DeviceRuntime& dev, const std::vector<at::Tensor>& inputs);

// Issues the copies back to the device (once per forward).
void load_inputs(const DeviceRuntime& dev, OffloadedInputs& o);

// The compute stream waits for the copies back (issued here if they were not yet); returns them.
std::vector<at::Tensor> loaded_inputs(const DeviceRuntime& dev, OffloadedInputs& o);

}  // namespace fsdpx
