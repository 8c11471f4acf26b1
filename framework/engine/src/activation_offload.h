// Activation offload (EngineOptions::activation_offload_units): a recomputed unit's main input,
// what its Recompute function keeps for backward, goes to host memory on the offload stream after
// the unit's forward and comes back, one unit ahead, before its backward.
//
// What moves: the unit's first argument when it is an activation (floating point, needing a
// gradient): the hidden state flowing through the layers. Other arguments, often one tensor shared
// by every layer (masks, positions, an encoder's output), stay on the device, saved as before.
//
// The stream protocol, without record_stream: every device buffer is allocated and freed by the
// compute stream. A copy to the host reads a source the compute stream wrote: the offload stream
// waits for the compute stream first, and the source is kept (the engine's `offloading`) until the
// next offloaded unit's forward has run, when the compute stream waits for the copy and lets the
// source go. A copy back writes into a buffer the compute stream allocated just before; an event
// after it is what the compute stream waits on before the recompute reads it, so that the next
// unit's copy back, issued behind it, still overlaps this unit's backward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/TensorImpl.h>

namespace fsdpx {

class DeviceRuntime;

// What one unit's forward moved to host memory, and what came back for its backward.
struct OffloadedInputs {
  std::vector<at::Tensor> host;    // per argument kept for backward: its host copy, or undefined
  std::vector<at::Tensor> loaded;  // after load_inputs: the device copies, undefined where kept
  // The moved inputs' version counters, and their versions when copied: a change in place after
  // the copy is refused at backward (the copy would not be the input).
  std::vector<c10::VariableVersion> versions;
  std::vector<uint32_t> copied_at;
  std::shared_ptr<c10::Event> loaded_event;  // recorded on the offload stream after the copies back
  bool loading = false;
  bool any() const { return !host.empty(); }
  void clear() { *this = OffloadedInputs(); }
};

// Whether the argument in `slot` moves (see above).
bool moves_to_host(const at::Tensor& input, int64_t slot);

// Copies the inputs `moves` marks to host memory on the offload stream, after the compute stream's
// work so far, into `o` (host copies and versions). The caller keeps the sources until the compute
// stream has waited for the offload stream.
void offload_inputs(const DeviceRuntime& dev, const std::vector<at::Tensor>& inputs, const std::vector<bool>& moves,
                    OffloadedInputs& o);

// Issues the copies back to the device (once per forward), and records `o.loaded_event` after them.
void load_inputs(const DeviceRuntime& dev, OffloadedInputs& o);

// The compute stream waits for this unit's copies back (issued here if they were not yet); returns
// them. Throws fsdpx::Error naming `unit` if a moved input was changed in place after its copy.
std::vector<at::Tensor> loaded_inputs(const DeviceRuntime& dev, OffloadedInputs& o, const std::string& unit);

}  // namespace fsdpx
