// Communicator: the collectives the sharding engine needs, over one process group.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <ATen/core/Tensor.h>

#include "fsdpx/export.h"

namespace fsdpx {

enum class Collective { AllGather = 0, ReduceScatter, AllReduce, Broadcast, Barrier, AllToAll };
constexpr int kNumCollectives = 6;

enum class ReduceOp { Sum, Avg, Max };

// What one rank of `ranks` sends of a collective whose payload (see CollectiveCounts) is
// `payload_bytes`, under the ring algorithm: (n-1)/n of the payload for all-gather,
// reduce-scatter and all-to-all, 2(n-1)/n for all-reduce, the payload for a broadcast's root
// (`root`), 0 otherwise. FSDP's communication formulas (3 psi, 2 psi) are stated in it. The one
// place it is written: CountingCommunicator counts with it, and the run plan predicts with it.
FSDPX_API int64_t ring_sent_bytes(Collective c, int64_t payload_bytes, int64_t ranks, bool root = false);

// An issued collective. wait() blocks until it has completed on this rank and its result is in
// place (including the division of an average), and throws fsdpx::Error naming the collective,
// the group and, when it can tell, the rank that was lost. Waiting twice is harmless.
class FSDPX_API Work {
 public:
  Work() = default;
  explicit Work(std::function<void()> wait);
  // Copies share one completion: whichever thread waits first completes it, the others block
  // until then; the finishing step runs once.
  void wait();

 private:
  struct State {
    std::mutex mutex;
    std::function<void()> wait;  // cleared after the first successful wait
  };
  std::shared_ptr<State> state_;
};

// The collectives of one process group. All ranks of the group call the same collectives in the
// same order with tensors of the same size and dtype (fp32 or bf16, or any dtype the backend
// supports), on the group's device, contiguous. Each call issues the collective and returns
// at once; the tensors must not be touched until wait() returns.
class FSDPX_API Communicator {
 public:
  virtual ~Communicator();
  virtual int rank() const = 0;  // within this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "shard", "replicate", ...

  // output (size() * input.numel() elements) := concatenation of every rank's input, in rank
  // order. Equivalent to torch.distributed.all_gather_into_tensor.
  virtual Work all_gather(at::Tensor output, at::Tensor input) = 0;
  // output := op over ranks r of input[rank() * n : (rank() + 1) * n], n = output.numel(),
  // input.numel() = size() * n. Equivalent to reduce_scatter_tensor.
  virtual Work reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) = 0;
  // tensor := op over ranks of tensor.
  virtual Work all_reduce(at::Tensor tensor, ReduceOp op) = 0;
  // input and output hold size() equal chunks: chunk r of input goes to rank r, and chunk r of
  // output comes from rank r. Equivalent to torch.distributed.all_to_all_single.
  virtual Work all_to_all(at::Tensor output, at::Tensor input) = 0;
  // tensor := root's tensor.
  virtual Work broadcast(at::Tensor tensor, int root) = 0;
  virtual Work barrier() = 0;
};

// What a CountingCommunicator saw, per collective.
struct CollectiveCounts {
  int64_t calls = 0;
  // The logical tensor: all-gather output, reduce-scatter and all-to-all input, all-reduce and
  // broadcast tensor.
  int64_t payload_bytes = 0;
  // What this rank sends under the ring algorithm (ring_sent_bytes).
  int64_t sent_bytes = 0;
};

struct FSDPX_API CommStats {
  std::array<CollectiveCounts, kNumCollectives> by_collective{};
  const CollectiveCounts& operator[](Collective c) const { return by_collective[static_cast<int>(c)]; }
  int64_t sent_bytes() const;
  int64_t payload_bytes() const;
};

// Bytes this process has sent over TCP so far (each byte once: retransmissions left out), summed
// over its open TCP sockets from the kernel's TCP_INFO: Gloo's connections, the store's. The
// difference across a step is what actually went on the wire (on CPU with Gloo; NCCL traffic
// does not go through these sockets). -1 if /proc is not readable.
FSDPX_API int64_t tcp_bytes_sent();

// Forwards every collective to `inner` and counts it. Thread-safe.
class FSDPX_API CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(std::shared_ptr<Communicator> inner);
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Work all_gather(at::Tensor output, at::Tensor input) override;
  Work reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) override;
  Work all_reduce(at::Tensor tensor, ReduceOp op) override;
  Work all_to_all(at::Tensor output, at::Tensor input) override;
  Work broadcast(at::Tensor tensor, int root) override;
  Work barrier() override;

  CommStats stats() const;
  void reset();

 private:
  void count(Collective c, int64_t payload, int64_t sent);
  std::shared_ptr<Communicator> inner_;
  mutable std::mutex mutex_;
  CommStats stats_;
};

}  // namespace fsdpx
