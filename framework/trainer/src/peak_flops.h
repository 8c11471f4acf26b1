// The per-rank peak a run's MFU is measured against.
#pragma once

#include <string>

#include <c10/core/ScalarType.h>

#include "fsdpx/framework/runtime/device.h"

namespace fsdpx {

struct PeakProbe {
  double tflops = 0;  // the best rate seen
  int64_t n = 0;      // of n x n x n matmuls
  double seconds = 0; // the probe's whole time
  std::string text() const;  // "best 1024^3 bf16 matmul in 0.12 s"
};

// Square matmuls in `dtype` on this rank, growing from 256 while one takes under 30 ms (up to
// 1024; 8192 on a device, timed between synchronisations) and three matrices fit in half the
// device's free memory, a few of each: bounded to about a quarter of a second even where `dtype`
// is slow (bf16 on a CPU without native bf16). Run by every rank at once, so that shared cores
// are shared as they will be in training. tflops stays 0 where not even 256 fits.
PeakProbe measure_peak_tflops(c10::ScalarType dtype, const DeviceRuntime& device);

}  // namespace fsdpx
