#include "fsdpx/framework/runtime/communicator.h"

namespace fsdpx {

int64_t ring_sent_bytes(Collective c, int64_t payload, int64_t n, bool root) {
  switch (c) {
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll: return payload / n * (n - 1);
    case Collective::AllReduce: return 2 * payload * (n - 1) / n;
    case Collective::Broadcast: return root && n > 1 ? payload : 0;
    case Collective::Barrier: return 0;
  }
  return 0;
}

Work::Work(std::function<void()> wait) : state_(std::make_shared<State>()) { state_->wait = std::move(wait); }

void Work::wait() {
  if (!state_) return;
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!state_->wait) return;
  state_->wait();
  state_->wait = nullptr;
}

Communicator::~Communicator() = default;

int64_t CommStats::sent_bytes() const {
  int64_t s = 0;
  for (const auto& c : by_collective) s += c.sent_bytes;
  return s;
}

int64_t CommStats::payload_bytes() const {
  int64_t s = 0;
  for (const auto& c : by_collective) s += c.payload_bytes;
  return s;
}

CountingCommunicator::CountingCommunicator(std::shared_ptr<Communicator> inner)
    : inner_(std::move(inner)) {}

void CountingCommunicator::count(Collective c, int64_t payload, int64_t sent) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& k = stats_.by_collective[static_cast<int>(c)];
  k.calls += 1;
  k.payload_bytes += payload;
  k.sent_bytes += sent;
}

namespace {
int64_t bytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()); }
}  // namespace

Work CountingCommunicator::all_gather(at::Tensor output, at::Tensor input) {
  const int64_t n = size(), payload = bytes(output);
  Work w = inner_->all_gather(std::move(output), std::move(input));
  count(Collective::AllGather, payload, ring_sent_bytes(Collective::AllGather, payload, n));
  return w;
}

Work CountingCommunicator::reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) {
  const int64_t n = size(), payload = bytes(input);
  Work w = inner_->reduce_scatter(std::move(output), std::move(input), op);
  count(Collective::ReduceScatter, payload, ring_sent_bytes(Collective::ReduceScatter, payload, n));
  return w;
}

Work CountingCommunicator::all_reduce(at::Tensor tensor, ReduceOp op) {
  const int64_t n = size(), payload = bytes(tensor);
  Work w = inner_->all_reduce(std::move(tensor), op);
  count(Collective::AllReduce, payload, ring_sent_bytes(Collective::AllReduce, payload, n));
  return w;
}

Work CountingCommunicator::all_to_all(at::Tensor output, at::Tensor input) {
  const int64_t n = size(), payload = bytes(input);
  Work w = inner_->all_to_all(std::move(output), std::move(input));
  count(Collective::AllToAll, payload, ring_sent_bytes(Collective::AllToAll, payload, n));
  return w;
}

Work CountingCommunicator::broadcast(at::Tensor tensor, int root) {
  const int64_t payload = bytes(tensor);
  Work w = inner_->broadcast(std::move(tensor), root);
  count(Collective::Broadcast, payload, ring_sent_bytes(Collective::Broadcast, payload, size(), rank() == root));
  return w;
}

Work CountingCommunicator::barrier() {
  Work w = inner_->barrier();
  count(Collective::Barrier, 0, 0);
  return w;
}

CommStats CountingCommunicator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CountingCommunicator::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_ = CommStats{};
}

}  // namespace fsdpx
