// StagedCommunicator: collectives on device tensors over a host backend (Gloo), which takes only
// CPU tensors. Each collective copies its device input into host memory (pinned where the device
// has it), runs the host collective, and its Work copies the result back to the device when it
// is waited for. CPU tensors pass straight through. It is how the simulated device communicates,
// and how several ranks share one GPU (--backend gloo with --device cuda).
//
// The staging copies run on the calling thread's current stream and complete before the host
// collective is issued (the host must hold the bytes Gloo sends): a rank's device work up to the
// collective is waited for. That is the price of staging; NCCL on a GPU of its own has none.
#pragma once

#include <memory>

#include "fsdpx/framework/runtime/communicator.h"

namespace fsdpx {

class StagedCommunicator final : public Communicator {
 public:
  // `host`: the backend's communicator; `host_options`: the staging buffers' options
  // (DeviceRuntime::host_options()).
  StagedCommunicator(std::shared_ptr<Communicator> host, at::TensorOptions host_options);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }

  Work all_gather(at::Tensor output, at::Tensor input) override;
  Work reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) override;
  Work all_reduce(at::Tensor tensor, ReduceOp op) override;
  Work all_to_all(at::Tensor output, at::Tensor input) override;
  Work broadcast(at::Tensor tensor, int root) override;
  Work barrier() override { return host_->barrier(); }

 private:
  // A host copy of `t` (staged input), or `t` itself on the CPU.
  at::Tensor to_host(const at::Tensor& t) const;
  // A host buffer shaped as `t`, or `t` itself on the CPU.
  at::Tensor host_like(const at::Tensor& t) const;
  // `work`, then `device` := `host` (nothing when they are the same tensor); the staging buffers
  // (`host`, and `staged_in` when it is one) are freed then.
  static Work then_copy_back(Work work, at::Tensor device, at::Tensor host, at::Tensor staged_in = {});

  std::shared_ptr<Communicator> host_;
  at::TensorOptions host_options_;
};

}  // namespace fsdpx
