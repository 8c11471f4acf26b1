#include "peak_flops.h"

#include <algorithm>
#include <chrono>

#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>

namespace fsdpx {

double measure_peak_tflops(c10::ScalarType dtype) {
  constexpr int64_t n = 1024;
  at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::matmul(a, b);  // warm-up
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    at::Tensor c = at::matmul(a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * n / best / 1e12;
}

}  // namespace fsdpx
