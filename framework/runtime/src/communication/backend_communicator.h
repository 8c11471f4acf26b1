// BackendCommunicator: the Communicator over one c10d backend (Gloo or NCCL). Every collective
// is checked before it is issued; its Work turns a failure into one message naming the rank, the
// collective, the group and, through the peer monitor, a lost rank. Every collective goes into the
// flight recorder; with check_collectives, the ranks first compare what they are about to call
// (one small all-gather) and a mismatch is an error before the collective runs.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "flight_recorder.h"
#include "peer_monitor.h"

namespace fsdpx {

class BackendCommunicator final : public Communicator, public std::enable_shared_from_this<BackendCommunicator> {
 public:
  BackendCommunicator(std::string name, c10::intrusive_ptr<c10d::Backend> backend, std::vector<int> global_ranks,
                      int global_rank, std::shared_ptr<const PeerMonitor> monitor, std::chrono::milliseconds timeout,
                      std::shared_ptr<FlightRecorder> recorder, bool check_collectives, c10::Device device);

  int rank() const override { return backend_->getRank(); }
  int size() const override { return backend_->getSize(); }
  const std::string& name() const override { return name_; }

  Work all_gather(at::Tensor output, at::Tensor input) override;
  Work reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) override;
  Work all_to_all(at::Tensor output, at::Tensor input) override;
  Work all_reduce(at::Tensor tensor, ReduceOp op) override;
  Work broadcast(at::Tensor tensor, int root) override;
  Work barrier() override;

 private:
  // LibTorch's Gloo reduce-scatter is an all-reduce underneath: each rank sends 2(n-1)/n of the
  // buffer instead of (n-1)/n (measured on the sockets, see fsdpx-comm-bench). An all-to-all
  // moves exactly the (n-1)/n: rank r receives everyone's slice r and sums the slices locally,
  // in rank order (so every rank adds in the same order), accumulating in fp32 or wider.
  Work reduce_scatter_by_all_to_all(uint64_t id, at::Tensor output, at::Tensor input, ReduceOp op);
  // LibTorch's Gloo all-gather stages its result in a temporary as large as the output, held
  // until the work is done: every unit gathered ahead would cost twice its bytes. One broadcast
  // per rank, each in place into that rank's slot of `output`, moves the same bytes (each rank
  // sends its share to the others) with no temporary.
  Work all_gather_by_broadcasts(uint64_t id, at::Tensor output, at::Tensor input);
  // After the collective: divides by the group size for an average (the backend sums: Gloo's
  // AVG is unreliable in some versions).
  std::function<void()> average(ReduceOp op, at::Tensor t) const;

  void check_one(const char* what, const at::Tensor& t) const;
  void check_average(const char* what, const at::Tensor& t, ReduceOp op) const;
  void check_pair(const char* what, const at::Tensor& out, const at::Tensor& in, bool sizes_ok, const char* rule) const;

  // The next collective of this group: numbered, checked across ranks (check_collectives) on
  // `device`, recorded. Returns its record's id.
  uint64_t begin(const char* what, c10::ScalarType dtype, int64_t count, c10::Device device);
  // The one small all-gather of check_collectives; throws fsdpx::Error naming what differs.
  void check_across_ranks(const FlightEntry& call, c10::Device device);
  // Issues the collective(s) `start` returns. The returned Work holds this communicator (and
  // so its backend and monitor) alive, waits for each in order with the timeout, then runs
  // `finish`.
  using C10dWorks = std::vector<c10::intrusive_ptr<c10d::Work>>;
  Work issue(const char* what, uint64_t id, const std::function<C10dWorks()>& start,
             std::function<void()> finish = nullptr);
  Error failure(const char* what, const std::exception& e, bool diagnose) const;

  std::string name_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::vector<int> global_ranks_;
  int global_rank_;
  std::shared_ptr<const PeerMonitor> monitor_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<FlightRecorder> recorder_;
  bool check_collectives_;
  c10::Device device_;  // of the group's tensors: the CPU under Gloo, the rank's device under NCCL or its twin
  bool gloo_;
  std::atomic<int64_t> seq_{0};
};

}  // namespace fsdpx
