#include "rank_zero.h"

#include <cstring>
#include <string>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include "fsdpx/error.h"

namespace fsdpx {

void on_rank_zero(Communicator& world, const std::function<void()>& work) {
  std::string error;
  if (world.rank() == 0) {
    try {
      work();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "rank 0 failed without a message";
    }
  }
  if (world.size() > 1) {
    at::Tensor length = at::full({1}, static_cast<int64_t>(error.size()), at::kLong);
    world.broadcast(length, 0).wait();
    const int64_t n = length.item<int64_t>();
    if (n > 0) {
      at::Tensor bytes = at::empty({n}, at::kByte);
      if (world.rank() == 0) std::memcpy(bytes.data_ptr(), error.data(), static_cast<size_t>(n));
      world.broadcast(bytes, 0).wait();
      error.assign(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(n));
    }
  }
  if (!error.empty()) throw Error(error);
}

}  // namespace fsdpx
