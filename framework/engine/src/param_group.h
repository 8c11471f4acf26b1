// ParamGroup: the parameters of one unit and their collectives (FSDP2's FSDPParamGroup). One flat
// shard (the all-gather input) and one flat gradient shard (the reduce-scatter output); while
// gathered, one storage of shard_size x shard elements in the compute dtype, which every
// parameter's module tensor views.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include "engine_config.h"
#include "float8_gather.h"
#include "sharded_param.h"

namespace fsdpx {

struct ParamGroup {
  const EngineConfig* config = nullptr;
  bool root = false;
  std::string label;  // the unit's name in collective records: its path, or "root"
  PrecisionSpec precision;  // this unit's dtypes (EngineOptions::unit_precision)
  // EngineOptions::reshard_after_forward_by_unit's, if it names this unit
  std::optional<ReshardAfterForward> reshard_choice;
  std::vector<ShardedParam> params;
  int64_t total = 0;  // shard elements (padded)
  at::Tensor flat_shard, flat_grad;
  c10::Storage unsharded;  // shard_size * total elements while gathered (float8 all-gather: the compute part's)
  at::Tensor unsharded_flat;  // over `unsharded`, for the copy-out
  // float8 all-gather: per parameter, whether it is gathered in float8 (the engine's builder
  // decides), and the unit's layout of it (on() when any is).
  std::vector<bool> gathers_float8;
  Float8Gather float8_gather;

  enum class State { Sharded, Gathering, Unsharded } state = State::Sharded;
  Work gather_work;
  at::Tensor gather_in, gather_out;
  // The post-forward part, kept under a post-forward group of k from the forward's all-gather to
  // the backward's: this rank's part of the all-gather's output, the shards of ranks
  // [j * S/k, (j + 1) * S/k) for j its index in its group of k (comms.post_forward), which the
  // backward all-gathers over that group.
  at::Tensor post_forward;
  bool gathers_post_forward = false;  // the all-gather in flight is over the group of k
  Work reduce_work;
  Work replicate_work;  // hybrid: the all-reduce across replicas, in flight after finish_reduce
  bool reduced = false, replicating = false;
  bool grads_held = false;  // flat_grad has its bytes and the shards their gradient views
  // The module's tensors show this rank's rows of the shards (show_shards): between steps.
  bool shown = false;
  // Their .grad is what show_shards gave them (the gradient rows), or what an optimizer made of
  // it since, until the unit's backward takes it (take_gradients): a zero_grad between a forward
  // and its backward counts.
  bool grad_shown = false;
  // The reduction in flight adds to flat_grad (it was held when the reduction began) instead of
  // writing it.
  bool accumulating = false;
  at::Tensor reduce_in, reduce_out;
  // Hybrid, when flat_grad cannot take the all-reduce in place (offloading: it is in host memory,
  // and collectives take device tensors only; accumulating: it holds an earlier gradient): the
  // reduced shard on the device in the gradient dtype, all-reduced there, then stored or added.
  at::Tensor replicate_on_device;

  bool sharded_layout() const { return config->shard_size > 1; }
  // One rank's row of the all-gather, in the all-gather's elements: the shard's, or float8
  // all-gather's bytes.
  int64_t gather_row() const { return float8_gather.on() ? float8_gather.row_bytes(precision.compute) : total; }
  // fsdpx/framework/engine/unit_buffers.h's rules for this unit: whether the gathered parameters
  // live in storage of their own (else they are the shards themselves), and whether the unit
  // reshards after forward.
  bool separate() const;
  bool reshard_after_forward() const;
  int post_forward_group() const;  // unit_buffers.h's post_forward_group for this unit

  // Lays out the shards, allocates the flat buffers, fills this rank's rows from the model's
  // initialisation (seed, name), and points every module tensor at its gathered view. `unit`
  // names the unit in the error a sharded parameter gives when read.
  void materialise(Model& model, const std::string& unit);

  // Between steps (the unit resharded): each module tensor becomes this rank's rows of its shard
  // (ShardedParam::local) with its gradient rows as .grad while gradients are held, so that any
  // optimizer over module->parameters() steps the shards; an unsharded gradient accumulated
  // without sync goes aside (ShardedParam::unsharded_grad). A no-op when shown.
  void show_shards();
  // Before a forward: each module tensor gets its gathered view back (or no storage while the unit
  // is sharded); its .grad stays what was shown until take_gradients. A no-op unless shown.
  void hide_shards();
  // Before the unit's gradients are accumulated (its backward begins, or ends without any): takes
  // over what was done to the shown gradients (an optimizer's zero_grad(set_to_none) dropped them:
  // every one dropped releases the gradients, as release_gradients; some dropped zero their rows;
  // one replaced by another tensor is copied in), then gives each module tensor its unsharded
  // gradient back. A no-op unless the gradients are shown.
  void take_gradients();

  // Issues the all-gather (async); Sharded -> Gathering. A no-op unless Sharded.
  void start_gather();
  // Waits for the all-gather and copies it out into the unsharded storage; -> Unsharded.
  void unshard();
  // Frees the unsharded storage; -> Sharded.
  void reshard();
  // Frees post_forward (a unit whose backward never gathered it: the step ended or failed), unless
  // an all-gather in flight reads it (abandon frees it then, after waiting).
  void drop_post_forward();
  // Gradient shards are held from a step's first reduction until release_gradients (FSDP2's
  // zero_grad(set_to_none=True)): between, flat_grad has no bytes and the shards no gradient.
  // hold_gradients gives flat_grad its bytes (zeroed when `zero`) and each trainable shard its
  // gradient view; a no-op while held. While held, a reduction adds to flat_grad.
  void hold_gradients(bool zero);
  void release_gradients();
  // Packs the parameters' unsharded gradients (then drops them) and issues the reduce-scatter
  // (or, unsharded, the all-reduce across replicas); async. Every collective is handed device
  // tensors only. The result is this rank's reduced shard: written into flat_grad when the
  // gradients were not held, added to it when they were (an earlier synchronised backward or
  // zero_grad since release_gradients), as FSDP2 adds to a sharded .grad already there.
  void reduce_grads();
  // Waits for reduce_grads' collective, stores or adds its result into flat_grad (offloading: on
  // the offload stream) and frees everything it used (the packed gradients, the collective's
  // buffers). A no-op if none. Hybrid: flat_grad then holds the shard before the average across
  // replicas, or, through replicate_on_device, nothing of it yet.
  void finish_reduce();
  // Hybrid: whether the reduced shard still needs the average across replicas, which
  // start_replicate issues (async: in place on flat_grad, or on replicate_on_device) and
  // finish_replicate waits for, storing or adding replicate_on_device into flat_grad.
  bool needs_replicate() const;
  void start_replicate();
  void finish_replicate();
  // EngineOptions::deterministic: flat_grad += each world rank's rows, in rank order.
  void add_in_rank_order();
  // After a failed or abandoned step: waits for and drops whatever is in flight, reshards.
  void abandon(bool drop_grads);

 private:
  // A forward under a post-forward group: keeps this rank's part of `gathered` (the all-gather's [S, total]).
  void keep_post_forward(const at::Tensor& gathered);
  void release_post_forward();  // frees it (nothing reads it any more)
  // Each shown module tensor's .grad: its gradient rows while held, else none.
  void show_gradients();
  at::Tensor gradient_rows(const ShardedParam& p) const;
  // The unsharded layout's reduction: the all-reduce across replicas (if any) of the packing.
  void reduce_unsharded();
  // Hybrid: whether the all-reduce across replicas runs on replicate_on_device.
  bool replicates_on_device() const;
  // flat_grad := result, or += result when accumulating; `result` may be on the device while
  // flat_grad is in host memory. On the current stream.
  void store_reduced(const at::Tensor& result);
};

}  // namespace fsdpx
