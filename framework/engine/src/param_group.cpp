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

}  // namespace

bool ParamGroup::separate() const {
  return gathers_into_own_storage(config->shard_size, precision, config->offloads());
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
    // for a backward after a forward under a post-forward group, what this rank kept (written on the compute
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

// A forward under a post-forward group keeps its part of the all-gather's output (a forward with gradients: one
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

}  // namespace fsdpx
