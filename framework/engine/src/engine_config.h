// What every part of one engine reads and never changes after construction.
#pragma once

#include <c10/core/TensorOptions.h>

#include "fsdpx/framework/engine/engine_options.h"

namespace fsdpx {

struct EngineConfig {
  EngineComms comms;
  EngineOptions options;
  int64_t shard_size = 1;  // ranks in the shard group
  int shard_rank = 0;      // this rank's index in it
  std::shared_ptr<const DeviceRuntime> device;  // options.device, or the CPU's

  // Options for a tensor of `dtype` where the engine computes.
  at::TensorOptions on_device(at::ScalarType dtype) const {
    return at::TensorOptions().dtype(dtype).device(device->device());
  }
  // Options for a shard or its gradient: host memory (pinned when the device has it) when
  // offloading, else the device.
  at::TensorOptions for_shards(at::ScalarType dtype) const {
    return offloads() ? device->host_options().dtype(dtype) : on_device(dtype);
  }
  bool offloads() const { return options.layout.offloads(device->is_cpu()); }
  // The clock to mark waits on: EngineOptions::clock while a step's span is open, else null.
  StepClock* timing() const { return options.clock && options.clock->stepping() ? options.clock.get() : nullptr; }
  // Metadata collectives (CPU tensors).
  Communicator& control() const { return comms.control ? *comms.control : *comms.world; }
};

}  // namespace fsdpx
