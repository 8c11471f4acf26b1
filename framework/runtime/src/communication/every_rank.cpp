#include "fsdpx/framework/runtime/every_rank.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

namespace fsdpx {
namespace {

template <class T>
std::vector<std::vector<T>> gather(Communicator& group, const std::vector<T>& mine, at::ScalarType dtype) {
  const int64_t n = static_cast<int64_t>(mine.size());
  const int ranks = group.size();
  at::Tensor local = at::from_blob(const_cast<T*>(mine.data()), {n}, dtype).clone();
  at::Tensor all = at::empty({ranks * n}, dtype);
  group.all_gather(all, local).wait();
  const T* a = all.data_ptr<T>();
  std::vector<std::vector<T>> out;
  for (int r = 0; r < ranks; ++r) out.emplace_back(a + r * n, a + (r + 1) * n);
  return out;
}

}  // namespace

std::vector<std::vector<double>> from_every_rank(Communicator& group, const std::vector<double>& mine) {
  return gather(group, mine, at::kDouble);
}

std::vector<std::vector<int64_t>> from_every_rank(Communicator& group, const std::vector<int64_t>& mine) {
  return gather(group, mine, at::kLong);
}

}  // namespace fsdpx
