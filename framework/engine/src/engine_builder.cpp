// Construction of a ShardingEngine: units from the wrap policy's selection, the ranks' agreement
// on the model, world-size-invariant initialisation of the shards, and the hooks.
#include <algorithm>
#include <functional>
#include <map>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "engine_state.h"
#include "fsdpx/error.h"
#include "fsdpx/framework/base/suggest.h"

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
  if (c.options.deterministic && c.comms.shard && c.comms.world->rank() % c.comms.shard->size() != c.comms.shard->rank())
    throw Error("deterministic mode needs shard groups of consecutive world ranks (world rank r at shard rank r % " +
                std::to_string(c.comms.shard->size()) + "), as ProcessGroups::hybrid makes them; world rank " +
                std::to_string(c.comms.world->rank()) + " is shard rank " + std::to_string(c.comms.shard->rank()));
  if (c.options.prefetch < 1) throw Error("prefetch must be at least 1, got " + std::to_string(c.options.prefetch));
}

std::unique_ptr<Unit> new_unit(ShardingEngine::Impl& e, const std::string& fqn, torch::nn::Module* module) {
  auto u = std::make_unique<Unit>();
  u->engine = &e;
  u->index = static_cast<int64_t>(e.units.size());
  u->fqn = fqn;
  u->module = module;
  u->group.config = &e.config;
  const EngineOptions& o = e.config.options;
  u->group.precision = o.unit_precision ? o.unit_precision(fqn) : o.precision;
  if (u->group.precision.storage != o.precision.storage || u->group.precision.gradient != o.precision.gradient)
    throw Error("unit '" + fqn + "' would store its shards in " + std::string(c10::toString(u->group.precision.storage)) +
                " with " + c10::toString(u->group.precision.gradient) + " gradients, the engine in " +
                c10::toString(o.precision.storage) + " with " + c10::toString(o.precision.gradient) +
                "; units may differ in compute and reduce dtypes only");
  return u;
}

// Walks the module tree: every module once, every parameter in its innermost unit (tied
// parameters once), units where the selection names them.
class UnitCollector {
 public:
  UnitCollector(ShardingEngine::Impl& e, const std::map<std::string, bool>& chosen) : e_(e), chosen_(chosen) {}

  void walk(torch::nn::Module& m, const std::string& fqn, Unit* unit) {
    auto [it, fresh] = seen_modules_.emplace(&m, fqn);
    if (!fresh)
      throw Error("module '" + fqn + "' is the same object as '" + it->second +
                  "'; a module reachable from two places cannot be sharded (its parameters would belong to two units)");
    if (!fqn.empty()) all_fqns_.push_back(fqn);
    if (!fqn.empty() && chosen_.count(fqn)) unit = start_unit(m, fqn, *unit);
    for (const auto& p : m.named_parameters(/*recurse=*/false)) add_param(fqn.empty() ? p.key() : fqn + "." + p.key(), p.value(), *unit);
    for (const auto& c : m.named_children()) walk(*c.value(), fqn.empty() ? c.key() : fqn + "." + c.key(), unit);
  }

  // After the walk: every selection named a submodule, and there is something to shard.
  void check_complete() const {
    for (const auto& [fqn, ckpt] : chosen_) {
      (void)ckpt;
      if (std::find(all_fqns_.begin(), all_fqns_.end(), fqn) == all_fqns_.end())
        throw Error("the wrap policy selected '" + fqn + "', which is not a submodule of the model" + did_you_mean(fqn, all_fqns_));
    }
    if (seen_params_.empty()) throw Error("the model has no parameters: there is nothing to shard or train");
  }

 private:
  Unit* start_unit(torch::nn::Module& m, const std::string& fqn, const Unit& outer) {
    if (!is_wrappable(m))
      throw Error("unit '" + fqn + "' is a " + m.name() +
                  ", which fsdpx cannot hook: only layers declared with FSDPX_MODULE (fsdpx/unit.h) can be units; "
                  "this model's wrappable layer types: " + join_names(e_.model->layer_types()));
    if (outer.checkpoint)
      throw Error("unit '" + fqn + "' is inside '" + outer.fqn +
                  "', whose activations are recomputed in backward; a recomputed unit cannot hold other units "
                  "(recompute the inner layer type instead, or do not make it a unit)");
    e_.units.push_back(new_unit(e_, fqn, &m));
    Unit* unit = e_.units.back().get();
    unit->checkpoint = chosen_.at(fqn);
    return unit;
  }

  void add_param(const std::string& name, const at::Tensor& t, Unit& unit) {
    if (!t.defined()) return;
    if (t.scalar_type() != at::kFloat)
      throw Error("parameter '" + name + "' is " + std::string(c10::toString(t.scalar_type())) +
                  "; the engine keeps fp32 parameters (other dtypes come through a precision policy)");
    auto [pit, new_param] = seen_params_.emplace(t.unsafeGetTensorImpl(), std::make_pair(name, unit.fqn));
    if (!new_param) {
      if (pit->second.second != unit.fqn)
        throw Error("parameter '" + name + "' is the same tensor as '" + pit->second.first +
                    "', but they are in different units ('" + unit.fqn + "' and '" + pit->second.second +
                    "'); shared parameters must stay in one unit: wrap a module that holds both");
      return;  // tied within one unit: one shard serves both names
    }
    ShardedParam q;
    q.name = name;
    q.param = t;
    q.shape = t.sizes().vec();
    unit.group.params.push_back(std::move(q));
  }

  ShardingEngine::Impl& e_;
  const std::map<std::string, bool>& chosen_;
  std::map<const torch::nn::Module*, std::string> seen_modules_;
  std::map<const c10::TensorImpl*, std::pair<std::string, std::string>> seen_params_;  // -> (param, unit)
  std::vector<std::string> all_fqns_;
};

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
                                            c10::toString(u->group.precision.reduce));
    for (const auto& p : u->group.params) checksum = parameter_seed(checksum, p.name + shape_text(p.shape) + "@" + u->fqn);
  }
  if (!e.config.comms.world || e.config.comms.world->size() <= 1) return;
  Communicator& control = e.config.control();
  const int n = control.size();
  at::Tensor mine = at::full({1}, static_cast<int64_t>(checksum & 0x7fffffffffffffffULL), at::kLong);
  at::Tensor all = at::empty({n}, at::kLong);
  control.all_gather(all, mine).wait();
  std::vector<std::string> differ;
  for (int r = 0; r < n; ++r)
    if (all[r].item<int64_t>() != all[0].item<int64_t>()) differ.push_back(std::to_string(r));
  if (!differ.empty())
    throw Error("the model differs between ranks: the parameter names and shapes, the units, the sharding layout, "
                "the overlap settings or the deterministic mode of rank(s) " + join_names(differ) +
                " do not match rank 0's; every rank must build the same model with the same options");
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

  std::map<std::string, bool> chosen;  // unit -> recomputes
  for (const auto& s : selected) {
    if (s.fqn.empty()) throw Error("the wrap policy selected the root; the root is always a unit and is not listed");
    if (!chosen.emplace(s.fqn, s.activation_checkpoint).second) throw Error("the wrap policy selected '" + s.fqn + "' twice");
  }
  e.units.push_back(new_unit(e, "", root.get()));
  e.units[0]->root = e.units[0]->group.root = true;
  UnitCollector collector(e, chosen);
  collector.walk(*root, "", e.units[0].get());
  collector.check_complete();
  check_ranks_agree(e);

  for (auto& u : e.units) {
    u->group.materialise(*e.model, u->fqn);
    int64_t trainable = 0;
    for (const ShardedParam& p : u->group.params)
      if (p.param.requires_grad()) trainable += numel_of(p.shape);
    u->progress_elements = (trainable + 1) / 2;
  }
  cast_buffers(*root, e.config.options.precision);
  // The plan, in the form wrap policies print it.
  std::vector<UnitSelection> sel;
  for (size_t i = 1; i < e.units.size(); ++i) sel.push_back({e.units[i]->fqn, chosen[e.units[i]->fqn]});
  e.plan = plan_units(*root, sel);
  // Hooked last, all at once; Impl removes them whenever it goes.
  e.hooks = std::make_unique<InstalledHooks>(e.units);
}

}  // namespace fsdpx
