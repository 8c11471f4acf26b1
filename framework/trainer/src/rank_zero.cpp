#include "rank_zero.h"

#include <cstring>
#include <string>
#include <vector>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/every_rank.h"

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

void refuse_together(Communicator& world, const std::string& refusal) {
  if (world.size() == 1) {
    if (!refusal.empty()) throw Error(refusal);
    return;
  }
  const auto lengths = from_every_rank(world, std::vector<int64_t>{static_cast<int64_t>(refusal.size())});
  int from = -1;
  for (int r = 0; r < world.size() && from < 0; ++r)
    if (lengths[static_cast<size_t>(r)][0] > 0) from = r;
  if (from < 0) return;
  const int64_t n = lengths[static_cast<size_t>(from)][0];
  at::Tensor bytes = at::empty({n}, at::kByte);
  if (world.rank() == from) std::memcpy(bytes.data_ptr(), refusal.data(), static_cast<size_t>(n));
  world.broadcast(bytes, from).wait();
  throw Error("rank " + std::to_string(from) + ": " +
              std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(n)));
}

}  // namespace fsdpx
