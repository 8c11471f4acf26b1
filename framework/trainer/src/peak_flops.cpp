#include "peak_flops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>

#include "seconds_since.h"

namespace fsdpx {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::string PeakProbe::text() const {
  char l[96];
  std::snprintf(l, sizeof l, "best %ld^3 matmul in %.2f s", static_cast<long>(n), seconds);
  return l;
}

PeakProbe measure_peak_tflops(c10::ScalarType dtype, const DeviceRuntime& device) {
  const auto start = Clock::now();
  PeakProbe p;
  // A GPU reaches its peak only on large products; the host times what the device finished.
  const int64_t largest = device.is_cpu() ? 1024 : 8192;
  // Its three matrices (two factors and a product) take at most half of what the device has free:
  // the model is already there, and a probe must never be what runs a device out of memory.
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t free_bytes = device.free_memory();
  for (int64_t n = 256; n <= largest && 3 * n * n * element <= free_bytes / 2; n *= 2) {
    at::Tensor a = at::randn({n, n}).to(device.device(), dtype), b = at::randn({n, n}).to(device.device(), dtype);
    at::matmul(a, b);  // warm-up
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      device.synchronize();
      const auto t0 = Clock::now();
      at::Tensor c = at::matmul(a, b);
      device.synchronize();
      best = std::min(best, seconds_since(t0));
    }
    const double tflops = 2.0 * static_cast<double>(n * n * n) / best / 1e12;
    if (tflops > p.tflops) {
      p.tflops = tflops;
      p.n = n;
    }
    if (best > 0.03) break;  // a slow dtype here: larger sizes would only cost time
  }
  p.seconds = seconds_since(start);
  return p;
}

}  // namespace fsdpx
