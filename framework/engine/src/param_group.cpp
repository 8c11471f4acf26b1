#include "param_group.h"

#include <atomic>
#include <memory>
#include <utility>
#include <cstdio>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/framework/base/fault_injection.h"
#include "fsdpx/framework/engine/unit_buffers.h"
#include "fsdpx/framework/runtime/collective_context.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "fsdpx/seeds.h"
#include "step_order.h"
#include "unit_collectives.h"

namespace fsdpx {

namespace {

// FSDPX_FAULT=skip-all-gather:R:UNIT (fsdpx/framework/base/fault_injection.h): global rank R skips
// the first all-gather of UNIT, as a rank with a bug would: it goes on with zeros, one collective
// behind the others from then on. For the flight recorder's and --check-collectives' tests.
bool fault_skips_gather(const EngineConfig& config, const std::string& unit) {
  static std::atomic<bool> done{false};
  if (done.load()) return false;
  const int rank = config.comms.world ? config.comms.world->rank() : 0;
  if (!fault_requested("skip-all-gather", rank, unit)) return false;
  done.store(true);
  std::fprintf(stderr, "fsdpx: FSDPX_FAULT=skip-all-gather:%d:%s: rank %d skips the all-gather of unit %s\n", rank,
               unit.c_str(), rank, unit.c_str());
  return true;
}

// Makes the reduce-scatter stream current while the result lives, after it waited for the work
// issued so far on the compute stream (the packing): a reduction's collective runs there.
std::unique_ptr<OnStream> on_reduce_stream(const DeviceRuntime& dev) {
  dev.wait_stream(StreamRole::ReduceScatter, StreamRole::Compute);
  return std::make_unique<OnStream>(dev, StreamRole::ReduceScatter);
}

}  // namespace

bool ParamGroup::separate() const {
  return gathers_into_own_storage(config->shard_size, precision) || config->offloads();
}

bool ParamGroup::reshard_after_forward() const {
  return reshards_after_forward(config->options.layout, root, reshard_choice, separate());
}

int ParamGroup::post_forward_group() const {
  return fsdpx::post_forward_group(config->options.layout, root, reshard_choice);
}

void ParamGroup::materialise(Model& model, const std::string& unit) {
  label = root ? "root" : unit;
  const int64_t S = config->shard_size;
  for (ShardedParam& p : params) {
    p.lay_out(S, total);
    total += p.geometry.shard_numel;
  }
  const PrecisionSpec& prec = precision;
  flat_shard = at::zeros({total}, config->for_shards(prec.storage));
  flat_grad = at::empty({total}, config->for_shards(prec.gradient));
  resize_storage(flat_grad.storage(), 0);  // no bytes until hold_gradients
  const c10::Device dev = config->device->device();
  if (!gathers_float8.empty()) float8_gather.lay_out(params, gathers_float8, S, dev);
  if (separate()) {
    const int64_t numel = float8_gather.on() ? float8_gather.compute_numel : total;
    unsharded =
        c10::Storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(S * numel) * c10::elementSize(prec.compute),
                     c10::GetAllocator(dev.type()), /*resizable=*/true);
    unsharded_flat = tensor_over(unsharded, 0, {S * numel}, prec.compute);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    ShardedParam& p = params[i];
    std::vector<int64_t> shard_shape = p.shape.empty() ? std::vector<int64_t>{1} : p.shape;
    shard_shape[0] = p.geometry.rows_per_shard;
    {
      at::NoGradGuard no_grad;
      p.shard = tensor_over(flat_shard.storage(), p.offset, shard_shape, prec.storage);
      // A frozen parameter stays frozen; a trainable one sees its slice of the unit's flat
      // gradient while gradients are held (hold_gradients).
      if (p.param.requires_grad()) p.shard.requires_grad_(true);
      p.init_shard(model, at::make_generator<at::CPUGeneratorImpl>(parameter_seed(config->options.seed, p.name)),
                   config->shard_rank);
    }
    // The module's parameter becomes a view of the unit's unsharded storage (or, unsharded, of
    // the shard itself); its object stays, so the model and autograd keep using it.
    p.gathered = float8_gather.on() ? float8_gather.gathered_view(i, p, unsharded, S, prec.compute)
                 : separate()       ? tensor_over(unsharded, S * p.offset, p.shape, prec.compute)
                                    : tensor_over(flat_shard.storage(), p.offset, p.shape, prec.storage);
    std::vector<int64_t> local_shape = p.shape;
    const int64_t mine = p.geometry.valid_rows(config->shard_rank);
    if (local_shape.empty() && mine == 0) local_shape = {0};  // a 0-dim parameter another rank holds
    else if (!local_shape.empty()) local_shape[0] = mine;
    p.local = tensor_over(flat_shard.storage(), p.offset, local_shape, prec.storage);
    // Read while its unit is sharded inside a step: almost always a unit's forward called around
    // its holder, which is what gathers it.
    p.sharded_message =
        "parameter '" + p.name + "' " + kNotGatheredHere + ": " +
        (root ? std::string("the root unit gathers it inside ShardedModule::forward's function, and reads of it "
                            "belong there")
              : "unit '" + unit + "' gathers it in its own forward, which its FSDPX_MODULE holder runs: call the "
                "holder (`layer(x)`), not layer->forward(x)") +
        "; between steps, module->parameters() are this rank's shards";
    p.attach();
  }
  if (separate()) resize_storage(unsharded, 0);
  if (float8_gather.on()) resize_storage(float8_gather.storage, 0);
  show_shards();
}

at::Tensor ParamGroup::gradient_rows(const ShardedParam& p) const {
  if (!grads_held || !p.param.requires_grad()) return at::Tensor();
  return tensor_over(flat_grad.storage(), p.offset, p.local.sizes(), flat_grad.scalar_type());
}

void ParamGroup::show_gradients() {
  if (!grad_shown) return;
  for (ShardedParam& p : params) p.param.mutable_grad() = p.shown_grad = gradient_rows(p);
}

void ParamGroup::show_shards() {
  if (shown || (separate() && state != State::Sharded)) return;
  for (ShardedParam& p : params) point_at(p.param, p.local);
  shown = true;
  if (grad_shown) return;  // a forward with no backward since: what was shown (or done to it) stays
  for (ShardedParam& p : params) p.unsharded_grad = p.param.grad();  // a backward without sync left it (or none)
  grad_shown = true;
  show_gradients();
}

void ParamGroup::hide_shards() {
  if (!shown) return;
  for (ShardedParam& p : params) {
    if (separate() && state != State::Unsharded) p.release();
    else p.attach();
  }
  shown = false;
}

void ParamGroup::take_gradients() {
  if (!grad_shown) return;
  grad_shown = false;  // from here on the module's tensors hold their unsharded gradients
  at::NoGradGuard no_grad;
  if (grads_held) {
    bool kept = false;
    for (ShardedParam& p : params) {
      if (!p.shown_grad.defined()) continue;
      const at::Tensor g = p.param.grad();
      if (!g.defined()) {
        p.shown_grad.zero_();
      } else {
        if (!g.is_same(p.shown_grad)) p.shown_grad.copy_(g);
        kept = true;
      }
    }
    if (!kept) release_gradients();
  }
  for (ShardedParam& p : params) {
    p.shown_grad = at::Tensor();
    p.param.mutable_grad() = std::exchange(p.unsharded_grad, at::Tensor());
  }
}

void ParamGroup::start_gather() {
  if (state != State::Sharded) return;
  state = State::Gathering;
  if (!sharded_layout()) return;
  trace_step(config->options.step_trace, "gather", root, label);
  const DeviceRuntime& dev = *config->device;
  // The copy-in waits for the shard as the compute stream last wrote it (the optimizer's step).
  dev.wait_stream(StreamRole::AllGatherCopyIn, StreamRole::Compute);
  gathers_post_forward = post_forward.defined();
  {
    OnStream on(dev, StreamRole::AllGatherCopyIn);
    // The shard in the compute dtype, on the device (offloading: copied from host memory now);
    // for a backward after the int form's forward, what this rank kept (written on the compute
    // stream, which the copy-in stream waited for).
    gather_in = gathers_post_forward ? post_forward
                : float8_gather.on() ? float8_gather.input(flat_shard, params, precision.compute, dev.device())
                                     : cast_for_all_gather(flat_shard, precision.compute, dev.device());
    const bool skip = fault_skips_gather(*config, label);
    gather_out = skip ? at::zeros({config->shard_size * gather_row()}, gather_in.options())
                      : at::empty({config->shard_size * gather_row()}, gather_in.options());
    if (skip) {
      gather_work = Work();
      return;
    }
  }
  dev.wait_stream(StreamRole::AllGather, StreamRole::AllGatherCopyIn);
  OnStream on(dev, StreamRole::AllGather);
  CollectiveUnit scope(label);
  Communicator& group =
      gathers_post_forward ? *config->comms.post_forward.at(post_forward_group()) : *config->comms.shard;
  gather_work = group.all_gather(gather_out, gather_in);
}

void ParamGroup::unshard() {
  if (state == State::Unsharded) return;
  start_gather();
  if (separate()) {
    const int64_t s = config->shard_size;
    at::Tensor src;
    if (sharded_layout()) {
      TimedSpan waiting(config->timing(), TimedPhase::AllGatherWait);
      gather_work.wait();  // the compute stream waits for the all-gather (the host, over Gloo)
      src = gather_out.view({s, gather_row()});
      keep_post_forward(src);
    } else {
      src = flat_shard.view({1, total});  // cast by the copy-out
    }
    resize_storage(unsharded, unsharded_flat.nbytes());
    if (float8_gather.on()) {
      resize_storage(float8_gather.storage, float8_gather.flat.nbytes());
      float8_gather.copy_out(unsharded_flat, src, params, s, precision.compute);
    } else {
      copy_out_gathered(unsharded_flat, src, params, s);
    }
    src = at::Tensor();
    if (sharded_layout()) {
      // The all-gather's buffers belong to the copy-in stream, whose next allocations may reuse
      // them: it waits for the copy-out first (the all-gather stream's next work waits for it).
      config->device->wait_stream(StreamRole::AllGatherCopyIn, StreamRole::Compute);
    }
    free_now(gather_out);  // now, not when the collective's bookkeeping lets it go
    gather_in = at::Tensor();  // the shard itself, or its cast, or post_forward
    if (gathers_post_forward) release_post_forward();  // the all-gather that read it is done
    for (const ShardedParam& p : params) p.attach();
  }
  state = State::Unsharded;
}

// The int form's forward keeps its part of the all-gather's output (a forward with gradients: one
// without has no backward); the backward's all-gather over the group of k gives the same output.
void ParamGroup::keep_post_forward(const at::Tensor& gathered) {
  const int k = post_forward_group();
  const int64_t S = config->shard_size;
  if (gathers_post_forward || !keeps_post_forward_part(k, static_cast<int>(S)) || !at::GradMode::is_enabled()) return;
  const int64_t rows = S / k, j = config->shard_rank % k;
  post_forward = gathered.narrow(0, j * rows, rows).reshape({-1}).clone();
}

void ParamGroup::drop_post_forward() {
  // Its all-gather may still read it (a unit prefetched in backward whose backward never came):
  // abandon() frees it once that is waited for.
  if (state == State::Gathering && gathers_post_forward) return;
  release_post_forward();
}

void ParamGroup::release_post_forward() {
  free_now(post_forward);
  gathers_post_forward = false;
}

void ParamGroup::reshard() {
  if (!separate() || state != State::Unsharded) return;
  trace_step(config->options.step_trace, "free", root, label);
  resize_storage(unsharded, 0);
  if (float8_gather.on()) resize_storage(float8_gather.storage, 0);
  for (const ShardedParam& p : params) p.release();
  state = State::Sharded;
}

void ParamGroup::hold_gradients(bool zero) {
  if (grads_held) return;
  at::NoGradGuard no_grad;
  resize_storage(flat_grad.storage(), static_cast<size_t>(total) * flat_grad.element_size());
  if (zero) flat_grad.zero_();
  for (ShardedParam& p : params)
    if (p.param.requires_grad())
      p.shard.mutable_grad() = tensor_over(flat_grad.storage(), p.offset, p.shard.sizes(), flat_grad.scalar_type());
  grads_held = true;
  show_gradients();
}

void ParamGroup::release_gradients() {
  for (ShardedParam& p : params) p.shard.mutable_grad() = at::Tensor();
  grads_held = false;
  show_gradients();  // before the bytes go: nothing shown views them
  resize_storage(flat_grad.storage(), 0);
}

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
