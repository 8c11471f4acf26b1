// ParamGroup's backward half: the gradients' reduce-scatter (or all-to-all, or the unsharded
// all-reduce), the replicate group's all-reduce, and abandoning a step's collectives.
#include "param_group.h"

#include <memory>
#include <utility>

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/framework/engine/unit_buffers.h"
#include "fsdpx/framework/runtime/collective_context.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "step_order.h"
#include "unit_collectives.h"

namespace fsdpx {

namespace {

// Makes the reduce-scatter stream current while the result lives, after it waited for the work
// issued so far on the compute stream (the packing): a reduction's collective runs there.
std::unique_ptr<OnStream> on_reduce_stream(const DeviceRuntime& dev) {
  dev.wait_stream(StreamRole::ReduceScatter, StreamRole::Compute);
  return std::make_unique<OnStream>(dev, StreamRole::ReduceScatter);
}

}  // namespace

void ParamGroup::reduce_grads() {
  at::NoGradGuard no_grad;
  CollectiveUnit scope(label);
  const auto& comms = config->comms;
  // Packed on the compute stream, where the gradients are (FSDP2's copy-in), so that they go at
  // once; offloading, the reduced shard alone goes to host memory. The collective runs on the
  // reduce-scatter stream, after what the compute stream did; every buffer it uses is allocated
  // here, on the compute stream, which waits for the collective before they go (finish_reduce).
  reduce_in = pack_gradients(params, config->shard_size, total, config->on_device(precision.reduce));
  accumulating = grads_held;
  if (config->options.deterministic) {
    // Every world rank gets every rank's gradient rows of its own shard, for this rank's one
    // sample (finish_reduce adds them in order). World rank r holds shard r % S (shard groups
    // are runs of consecutive ranks: checked at construction). Unsharded, every rank needs all
    // of it: an all-gather, which sends as much without W copies to send from.
    const int64_t W = comms.world->size(), S = config->shard_size;
    hold_gradients(/*zero=*/true);  // finish_reduce adds every sample's contributions
    reduce_out = at::empty({W * total}, reduce_in.options());
    if (S != W && S != 1)
      reduce_in = reduce_in.view({S, total})
                      .index_select(0, at::arange(W, at::kLong).remainder(S).to(reduce_in.device()))
                      .reshape({-1});
    const auto on = on_reduce_stream(*config->device);
    if (S == 1) {
      reduce_work = comms.world->all_gather(reduce_out, reduce_in);
    } else {
      reduce_work = comms.world->all_to_all(reduce_out, reduce_in);
    }
  } else if (sharded_layout()) {
    // Straight into the gradient shard when it holds nothing yet and the dtypes and devices
    // agree; else through a reduce-dtype buffer on the device, stored or added by finish_reduce.
    hold_gradients(/*zero=*/false);
    const bool direct =
        !accumulating && reduce_in.scalar_type() == flat_grad.scalar_type() && flat_grad.device() == reduce_in.device();
    reduce_out = direct ? flat_grad : at::empty({total}, reduce_in.options());
    const auto on = on_reduce_stream(*config->device);
    reduce_work = comms.shard->reduce_scatter(reduce_out, reduce_in, ReduceOp::Avg);
  } else {
    reduce_unsharded();
  }
  reduced = true;
}

void ParamGroup::reduce_unsharded() {
  const auto& comms = config->comms;
  hold_gradients(/*zero=*/false);
  if (!comms.replicate) {  // one replica: the packing is the gradient shard
    store_reduced(reduce_in);
    free_now(reduce_in);
    return;
  }
  if (!accumulating && !config->offloads()) {  // averaged in place on the gradient shard, on the device
    flat_grad.copy_(reduce_in);
    free_now(reduce_in);
    const auto on = on_reduce_stream(*config->device);
    reduce_work = comms.replicate->all_reduce(flat_grad, ReduceOp::Avg);
    return;
  }
  // On a device buffer in the gradient dtype, as the in-place average has it (the packing itself
  // when the dtypes agree); finish_reduce stores or adds it.
  reduce_out = reduce_in.to(flat_grad.scalar_type());
  if (reduce_out.is_same(reduce_in)) reduce_in = at::Tensor();
  const auto on = on_reduce_stream(*config->device);
  reduce_work = comms.replicate->all_reduce(reduce_out, ReduceOp::Avg);
}

void ParamGroup::store_reduced(const at::Tensor& result) {
  at::NoGradGuard no_grad;
  if (!accumulating) {
    flat_grad.copy_(result);
  } else if (result.device() == flat_grad.device()) {
    flat_grad.add_(result);
  } else {  // offloading: through host memory, in the gradient dtype (exact for a wider one)
    flat_grad.add_(result.to(flat_grad.device(), flat_grad.scalar_type()));
  }
}

void ParamGroup::finish_reduce() {
  if (!reduced) return;
  reduced = false;
  TimedSpan waiting(config->timing(), TimedPhase::ReduceScatterWait);  // until compute may read the shard
  const DeviceRuntime& dev = *config->device;
  {
    OnStream on(dev, StreamRole::ReduceScatter);
    reduce_work.wait();
    reduce_work = Work();
  }
  if (replicates_on_device()) {
    // The reduced shard stays on the device for the all-reduce across replicas. The compute
    // stream, which allocated the buffers, waits for the reduce-scatter before the cast and the
    // frees.
    dev.wait_stream(StreamRole::Compute, StreamRole::ReduceScatter);
    free_now(reduce_in);
    at::NoGradGuard no_grad;
    replicate_on_device = reduce_out.to(flat_grad.scalar_type());
    if (!replicate_on_device.is_same(reduce_out)) free_now(reduce_out);
    reduce_out = at::Tensor();
    return;
  }
  // The reduced shard is finished on the reduce-scatter stream, or, offloading, copied to host
  // memory on the offload stream after it; the compute stream waits for it before anything reads
  // it or a buffer goes.
  const StreamRole finish = config->offloads() ? StreamRole::Offload : StreamRole::ReduceScatter;
  const bool separate_out = reduce_out.defined() && !reduce_out.is_same(flat_grad);
  dev.wait_stream(finish, StreamRole::ReduceScatter);
  {
    OnStream on(dev, finish);
    if (config->options.deterministic) {
      add_in_rank_order();
    } else if (separate_out) {
      store_reduced(reduce_out);
    }
  }
  dev.wait_stream(StreamRole::Compute, finish);  // and so for the reduce-scatter stream too
  free_now(reduce_in);  // packed by reduce_grads: ours alone
  if (separate_out) free_now(reduce_out);
  reduce_out = at::Tensor();
}

bool ParamGroup::needs_replicate() const {
  // Deterministic mode exchanged with every world rank already.
  return sharded_layout() && config->comms.replicate != nullptr && !config->options.deterministic;
}

bool ParamGroup::replicates_on_device() const { return needs_replicate() && (config->offloads() || accumulating); }

void ParamGroup::start_replicate() {
  CollectiveUnit scope(label);
  const DeviceRuntime& dev = *config->device;
  // On the all-reduce stream, after the reduced shard (finish_reduce: the compute stream has it).
  dev.wait_stream(StreamRole::AllReduce, StreamRole::Compute);
  OnStream on(dev, StreamRole::AllReduce);
  const at::Tensor& shard = replicate_on_device.defined() ? replicate_on_device : flat_grad;
  replicate_work = config->comms.replicate->all_reduce(shard, ReduceOp::Avg);
  replicating = true;
}

// Deterministic mode: world rank r computed global sample (j * W + r) of this round, so adding
// the ranks' contributions to this rank's rows one by one, in rank order, continues the sum over
// global samples in their order, whatever W is. Elementwise, so any split into shards agrees.
void ParamGroup::add_in_rank_order() {
  at::NoGradGuard no_grad;
  const int64_t W = config->comms.world->size();
  at::Tensor all = reduce_out.view({W, total}).to(flat_grad.device());  // offloading: to host memory, then added
  for (int64_t r = 0; r < W; ++r) flat_grad.add_(all[r]);
}

void ParamGroup::finish_replicate() {
  if (!replicating) return;
  replicating = false;
  TimedSpan waiting(config->timing(), TimedPhase::ReduceScatterWait);  // the replicas' average, as a reduction
  const DeviceRuntime& dev = *config->device;
  {
    OnStream on(dev, StreamRole::AllReduce);
    replicate_work.wait();
    replicate_work = Work();
  }
  if (!replicate_on_device.defined()) {  // averaged in place
    dev.wait_stream(StreamRole::Compute, StreamRole::AllReduce);
    return;
  }
  // Stored after the all-reduce (offloading: copied to host memory on the offload stream); the
  // compute stream, which allocated the buffer, then knows every use of it and frees it.
  const StreamRole finish = config->offloads() ? StreamRole::Offload : StreamRole::AllReduce;
  dev.wait_stream(finish, StreamRole::AllReduce);
  {
    OnStream on(dev, finish);
    store_reduced(replicate_on_device);
  }
  dev.wait_stream(StreamRole::Compute, finish);
  free_now(replicate_on_device);
}

namespace {
// Waits for `work` of a step being abandoned: its failure was or will be reported elsewhere.
void wait_quietly(Work& work) {
  try {
    work.wait();
  } catch (const std::exception&) {
  }
}
}  // namespace

void ParamGroup::abandon(bool drop_grads) {
  // Whatever is in flight is waited for, then every stream waits for every other, so that none
  // still uses the buffers that go.
  if (state == State::Gathering) wait_quietly(gather_work);
  if (reduced) wait_quietly(reduce_work);
  if (replicating) wait_quietly(replicate_work);
  if (state == State::Gathering || reduced || replicating || replicate_on_device.defined())
    config->device->join_streams();
  if (state == State::Gathering) {
    gather_out = at::Tensor();
    gather_in = at::Tensor();
    state = State::Sharded;
  }
  if (reduced) {
    reduce_in = at::Tensor();
    reduce_out = at::Tensor();
    reduced = false;
  }
  if (replicating) {
    replicating = false;
    replicate_work = Work();
  }
  replicate_on_device = at::Tensor();
  release_post_forward();  // after the wait for its all-gather above
  reshard();
  if (drop_grads)
    for (auto& p : params) {
      p.unsharded_grad = at::Tensor();
      if (!grad_shown) p.param.mutable_grad() = at::Tensor();
    }
}

}  // namespace fsdpx
