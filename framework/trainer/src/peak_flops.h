// The per-rank peak a run's MFU is measured against.
#pragma once

#include <c10/core/ScalarType.h>

namespace fsdpx {

// The best of a few large matmuls in `dtype`, in TFLOP/s, on this rank (run by every rank at
// once, so shared cores are shared as they will be in training).
double measure_peak_tflops(c10::ScalarType dtype);

}  // namespace fsdpx
