// Construction of a ShardingEngine: units from the wrap policy's selection, the ranks' agreement
// on the model, world-size-invariant initialisation of the shards, and the hooks.
#include "engine_builder.h"

#include <algorithm>
#include <functional>
#include <map>

#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/capabilities.h"
#include "fsdpx/error.h"
#include "fsdpx/framework/engine/unit_buffers.h"
#include "fsdpx/framework/engine/unit_precision.h"
#include "fsdpx/framework/runtime/every_rank.h"
#include "fsdpx/suggest.h"
#include "module_tree.h"
#include "step_order.h"

namespace fsdpx {
namespace {

void check_layout(const EngineConfig& c) {
  const ShardingLayout& layout = c.options.layout;
  const int world = c.comms.world ? c.comms.world->size() : 1;
  if (layout.shard_group_size * layout.replicate_group_size != world)
    throw Error("sharding layout " + std::to_string(layout.shard_group_size) + " (shard) x " +
                std::to_string(layout.replicate_group_size) + " (replicate) does not cover the world of " +
                std::to_string(world) + " ranks");
  if ((layout.shard_group_size > 1) != static_cast<bool>(c.comms.shard) ||
      (c.comms.shard && c.comms.shard->size() != layout.shard_group_size) ||
      (layout.replicate_group_size > 1) != static_cast<bool>(c.comms.replicate) ||
      (c.comms.replicate && c.comms.replicate->size() != layout.replicate_group_size))
    throw Error("the engine's communicators do not match the sharding layout (a bug in the host)");
  if (c.options.deterministic && !c.comms.world)
    throw Error("deterministic mode sums every rank's gradients over comms.world, and the engine was given none");
  if (c.options.deterministic && c.comms.shard &&
      c.comms.world->rank() % c.comms.shard->size() != c.comms.shard->rank())
    throw Error("deterministic mode needs shard groups of consecutive world ranks (world rank r at shard rank r % " +
                std::to_string(c.comms.shard->size()) + "), as ProcessGroups::hybrid makes them; world rank " +
                std::to_string(c.comms.world->rank()) + " is shard rank " + std::to_string(c.comms.shard->rank()));
  if (c.options.prefetch < 1) throw Error("prefetch must be at least 1, got " + std::to_string(c.options.prefetch));
}

std::unique_ptr<Unit> new_unit(ShardingEngine::Impl& e, const std::string& fqn, const torch::nn::Module* module) {
  auto u = std::make_unique<Unit>();
  u->step = &e;
  u->index = static_cast<int64_t>(e.units.size());
  u->fqn = fqn;
  u->module = module;
  u->group.config = &e.config;
  const EngineOptions& o = e.config.options;
  u->group.precision = o.unit_precision ? o.unit_precision(fqn) : o.precision;
  u->float8 = o.unit_float8 && o.unit_float8(fqn);
  check_unit_precision(fqn, u->group.precision, o.precision);
  u->group.reshard_choice = reshard_choice_of(o, fqn);
  return u;
}

// What the engine refuses of a walked tree, beyond what plan_units does: a module reachable from
// two places, a layer it cannot hook, a tensor shared between units, a parameter not in fp32, and
// a model without parameters.
void check_shardable(const ModuleTree& tree, const Model& model) {
  if (const auto& r = tree.repeated_module)
    throw Error("module '" + r->fqn + "' is the same object as '" + r->first_fqn +
                "'; a module reachable from two places cannot be sharded (its parameters would belong to two units)");
  size_t params = 0;
  for (const ModuleTree::Unit& u : tree.units) {
    if (!u.fqn.empty() && !is_wrappable(*u.module))
      throw Error("unit '" + u.fqn + "' is a " + u.module->name() +
                  ", which fsdpx cannot hook: only layers declared with FSDPX_MODULE (fsdpx/unit.h) can be units; "
                  "this model's wrappable layer types: " + join_names(model.layer_types()));
    for (const auto& [name, t] : u.params)
      if (t.scalar_type() != at::kFloat)
        throw Error("parameter '" + name + "' is " + std::string(c10::toString(t.scalar_type())) +
                    "; the engine keeps fp32 parameters (other dtypes come through a precision policy)");
    params += u.params.size();
  }
  if (const auto& tie = tree.tie_across_units)
    throw Error("parameter '" + tie->param + "' is the same tensor as '" + tie->first_param +
                "', but they are in different units ('" + tie->unit + "' and '" + tie->first_unit +
                "'); shared parameters must stay in one unit: wrap a module that holds both");
  if (params == 0) throw Error("the model has no parameters: there is nothing to shard or train");
}

// A post-forward group of k: k divides the shard group's size, and comms.post_forward has
// k's group.
void check_post_forward_group(const ShardingEngine::Impl& e, const std::string& fqn, const ReshardAfterForward& c) {
  if (!c.is_int) return;
  const int S = e.config.options.layout.shard_group_size;
  if (c.group < 1 || S % c.group != 0) {
    std::string divisors;
    for (int k = 1; k <= S; ++k)
      if (S % k == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(k);
    throw Error("reshard_after_forward for '" + fqn + "' is " + std::to_string(c.group) +
                ", which does not divide the shard group's size " + std::to_string(S) +
                "; give true, false or one of " + divisors);
  }
  if (c.group == 1 || c.group == S) return;
  const auto it = e.config.comms.post_forward.find(c.group);
  if (it == e.config.comms.post_forward.end() || !it->second || it->second->size() != c.group)
    throw Error("reshard_after_forward for '" + fqn + "' is " + std::to_string(c.group) +
                ", and the engine was given no group of " + std::to_string(c.group) +
                " ranks for it (EngineComms::post_forward)");
}

// EngineOptions::reshard_after_forward_by_unit names units only, and not the root.
void check_reshard_choices(const ShardingEngine::Impl& e) {
  std::vector<std::string> units;
  for (const auto& u : e.units)
    if (!u->fqn.empty()) units.push_back(u->fqn);
  for (const auto& [fqn, choice] : e.config.options.reshard_after_forward_by_unit) {
    if (fqn.empty())
      throw Error("reshard_after_forward is set for the root (\"\"), which never reshards: its parameters are "
                  "needed first in backward; set it for the units: " + join_names(units));
    if (std::find(units.begin(), units.end(), fqn) == units.end())
      throw Error("reshard_after_forward is set for '" + fqn + "', which is not a unit (the units: " +
                  join_names(units) + ")" + did_you_mean(fqn, units));
    check_post_forward_group(e, fqn, choice);
  }
}

// EngineOptions::activation_offload_units names units that recompute; they are marked.
void mark_offloaded_units(ShardingEngine::Impl& e) {
  std::vector<std::string> units, recomputed;
  for (const auto& u : e.units)
    if (!u->fqn.empty()) {
      units.push_back(u->fqn);
      if (u->checkpoint) recomputed.push_back(u->fqn);
    }
  for (const std::string& fqn : e.config.options.activation_offload_units) {
    if (fqn.empty())
      throw Error("activation offload is set for the root (\"\"), which never recomputes; set it for recomputed "
                  "units" + (recomputed.empty() ? std::string() : ": " + join_names(recomputed)));
    const auto it = std::find_if(e.units.begin(), e.units.end(), [&](const auto& u) { return u->fqn == fqn; });
    if (it == e.units.end())
      throw Error("activation offload is set for '" + fqn + "', which is not a unit (the units: " + join_names(units) +
                  ")" + did_you_mean(fqn, units));
    if (!(*it)->checkpoint)
      throw Error("activation offload is set for unit '" + fqn + "', which does not recompute its activations: "
                  "only a recomputed unit's inputs can move (LibTorch's C++ autograd has no saved-tensor hooks); "
                  "checkpoint it too" + (recomputed.empty() ? std::string() : " (recomputed: " +
                  join_names(recomputed) + ")"));
    (*it)->offload = true;
  }
}

// Every rank must have built the same model and run the same collectives: compare a checksum
// of the layout, the overlap, precision and deterministic settings, and every parameter's name,
// shape and unit.
void check_ranks_agree(const ShardingEngine::Impl& e) {
  const EngineOptions& o = e.config.options;
  const ShardingLayout& layout = o.layout;
  uint64_t checksum = parameter_seed(o.seed, "layout/" + std::to_string(layout.shard_group_size) + "x" +
                                                 std::to_string(layout.replicate_group_size) + "/" +
                                                 std::to_string(layout.reshard_after_forward) + "/" +
                                                 std::to_string(o.overlap) + "/" + std::to_string(o.prefetch) + "/" +
                                                 std::to_string(o.deterministic) + "/" +
                                                 c10::toString(o.precision.storage) + "/" +
                                                 c10::toString(o.precision.compute) + "/" +
                                                 c10::toString(o.precision.reduce));
  for (const auto& u : e.units) {
    checksum = parameter_seed(checksum, u->fqn + ":" + c10::toString(u->group.precision.compute) + "/" +
                                            c10::toString(u->group.precision.reduce) + "/" +
                                            std::to_string(u->group.post_forward_group()));
    for (const auto& p : u->group.params)
      checksum = parameter_seed(checksum, p.name + shape_text(p.shape) + "@" + u->fqn);
  }
  if (!e.config.comms.world || e.config.comms.world->size() <= 1) return;
  const auto all =
      from_every_rank(e.config.control(), std::vector<int64_t>{static_cast<int64_t>(checksum & 0x7fffffffffffffffULL)});
  std::vector<std::string> differ;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0]) differ.push_back(std::to_string(r));
  if (!differ.empty())
    throw Error("the model differs between ranks: the parameter names and shapes, the units, the sharding layout, "
                "the overlap settings or the deterministic mode of rank(s) " + join_names(differ) +
                " do not match rank 0's; every rank must build the same model with the same options");
}

// float8 all-gather: the float8 units' parameters the model lists among its linear weights, of
// shapes float8 takes, are gathered in float8; refused where nothing would be.
void mark_float8_gathered(ShardingEngine::Impl& e) {
  if (!e.config.options.float8_all_gather) return;
  const auto* linear = dynamic_cast<const LinearWeights*>(e.model.get());
  int64_t float8 = 0;
  for (auto& u : e.units) {
    if (!u->float8 || !linear) continue;
    u->group.gathers_float8.assign(u->group.params.size(), false);
    for (size_t i = 0; i < u->group.params.size(); ++i) {
      const ShardedParam& p = u->group.params[i];
      if (!gathers_in_float8(linear->linear_weight(p.name), p.shape)) continue;
      u->group.gathers_float8[i] = true;
      ++float8;
    }
  }
  check_float8_all_gather(static_cast<int>(e.config.shard_size), linear != nullptr, float8);
}

// Module buffers in the precision's buffer dtype (floating ones; they are not sharded).
void cast_buffers(torch::nn::Module& root, const PrecisionSpec& precision) {
  if (!precision.buffer) return;
  at::NoGradGuard no_grad;
  for (auto& b : root.buffers())
    if (b.defined() && at::isFloatingType(b.scalar_type()) && b.scalar_type() != *precision.buffer)
      b.set_data(b.to(*precision.buffer));
}

}  // namespace

void build_engine(ShardingEngine::Impl& e, const std::vector<UnitSelection>& selected) {
  check_layout(e.config);
  e.config.shard_size = e.config.options.layout.shard_group_size;
  e.config.shard_rank = e.config.comms.shard ? e.config.comms.shard->rank() : 0;
  std::shared_ptr<torch::nn::Module> root = e.model->module();
  if (!root) throw Error("the model has no module");
  const ModuleTree tree = ModuleTree::walk(*root, selected);
  check_shardable(tree, *e.model);
  for (const ModuleTree::Unit& t : tree.units) {
    e.units.push_back(new_unit(e, t.fqn, t.module));
    Unit& u = *e.units.back();
    u.root = u.group.root = t.fqn.empty();
    u.checkpoint = t.recompute;
    for (const auto& [name, param] : t.params) {
      ShardedParam q;
      q.name = name;
      q.param = param;
      q.shape = param.sizes().vec();
      u.group.params.push_back(std::move(q));
    }
  }
  check_reshard_choices(e);
  mark_float8_gathered(e);
  mark_offloaded_units(e);
  check_ranks_agree(e);
  // The plan, in the form wrap policies print it: of the whole parameters, before they become
  // this rank's shards.
  e.plan = tree.plan();

  for (auto& u : e.units) {
    u->group.materialise(*e.model, u->fqn);
    int64_t trainable = 0;
    for (const ShardedParam& p : u->group.params)
      if (p.param.requires_grad()) trainable += numel_of(p.shape);
    u->progress_elements = progress_after(trainable);
  }
  cast_buffers(*root, e.config.options.precision);
  // Hooked last, all at once; Impl removes them whenever it goes.
  e.hooks = std::make_unique<InstalledHooks>(e.units);
}

void use_precision_policy(EngineOptions& o, std::shared_ptr<const PrecisionPolicy> policy) {
  o.unit_precision = [policy](const std::string& unit) { return policy->spec(unit); };
  o.unit_float8 = nullptr;
  if (const auto* f8 = dynamic_cast<const Float8Units*>(policy.get()))
    o.unit_float8 = [policy, f8](const std::string& unit) { return f8->float8(unit); };
  const auto* gather = dynamic_cast<const Float8AllGather*>(policy.get());
  o.float8_all_gather = o.unit_float8 && gather && gather->float8_all_gather();
}

}  // namespace fsdpx
