// fsdpx/capabilities.h: optional capabilities a component declares (plugin ABI 1.1), found by
// the host with dynamic_cast like the evaluation mix-ins. A component without one is taken to
// have the default said here.
#pragma once

#include "fsdpx/export.h"

namespace fsdpx {

// On an optimizer: where its step can run. Default (not declared): on the CPU too.
class FSDPX_API OptimizerDevices {
 public:
  virtual ~OptimizerDevices();
  // Whether step() can update shards, gradients and state that live in host memory, as
  // cpu_offload needs (a fused CUDA-only kernel cannot).
  virtual bool runs_on_cpu() const = 0;
};

}  // namespace fsdpx
