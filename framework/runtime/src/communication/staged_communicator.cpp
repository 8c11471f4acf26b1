#include "staged_communicator.h"

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/framework/runtime/memory_accounting.h"

namespace fsdpx {

StagedCommunicator::StagedCommunicator(std::shared_ptr<Communicator> host, at::TensorOptions host_options)
    : host_(std::move(host)), host_options_(host_options.device(c10::kCPU)) {}

at::Tensor StagedCommunicator::to_host(const at::Tensor& t) const {
  if (t.device().is_cpu()) return t;
  at::NoGradGuard no_grad;
  at::Tensor h = at::empty(t.sizes(), host_options_.dtype(t.scalar_type()));
  h.copy_(t);  // blocking: Gloo reads these bytes from another thread
  return h;
}

at::Tensor StagedCommunicator::host_like(const at::Tensor& t) const {
  return t.device().is_cpu() ? t : at::empty(t.sizes(), host_options_.dtype(t.scalar_type()));
}

Work StagedCommunicator::then_copy_back(Work work, at::Tensor device, at::Tensor host, at::Tensor staged_in) {
  if (device.is_same(host) && !staged_in.defined()) return work;
  return Work([work, device, host, staged_in]() mutable {
    work.wait();
    if (!device.is_same(host)) {
      at::NoGradGuard no_grad;
      device.copy_(host);
      free_now(host);  // the staging buffers' bytes go now, whoever else holds the tensors
    }
    if (staged_in.defined() && !staged_in.is_same(host)) free_now(staged_in);
  });
}

// A staged input is freed after the collective when it is a copy (not the caller's CPU tensor).
Work StagedCommunicator::all_gather(at::Tensor output, at::Tensor input) {
  at::Tensor out = host_like(output), in = to_host(input);
  return then_copy_back(host_->all_gather(out, in), output, out, in.is_same(input) ? at::Tensor() : in);
}

Work StagedCommunicator::reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) {
  at::Tensor out = host_like(output), in = to_host(input);
  return then_copy_back(host_->reduce_scatter(out, in, op), output, out, in.is_same(input) ? at::Tensor() : in);
}

Work StagedCommunicator::all_reduce(at::Tensor tensor, ReduceOp op) {
  at::Tensor h = to_host(tensor);
  return then_copy_back(host_->all_reduce(h, op), tensor, h);
}

Work StagedCommunicator::all_to_all(at::Tensor output, at::Tensor input) {
  at::Tensor out = host_like(output), in = to_host(input);
  return then_copy_back(host_->all_to_all(out, in), output, out, in.is_same(input) ? at::Tensor() : in);
}

Work StagedCommunicator::broadcast(at::Tensor tensor, int root) {
  at::Tensor h = to_host(tensor);
  return then_copy_back(host_->broadcast(h, root), tensor, h);
}

}  // namespace fsdpx
