#include "components.h"

#include <algorithm>
#include <map>

#include "fsdpx/capabilities.h"
#include "fsdpx/suggest.h"

namespace fsdpx {

const ComponentChoice& chosen(const RunConfig& config, Kind kind) {
  const ComponentChoice* c = config.choice(kind);
  if (!c)
    throw Error(std::string("no ") + section_name(kind) + " component chosen; give --" + section_name(kind) +
                ".name NAME");
  return *c;
}

Batch on_device(Batch b, const c10::Device& device) {
  if (device.is_cpu()) return b;
  b.inputs = b.inputs.to(device, /*non_blocking=*/true);  // from pinned memory where the source pinned it
  b.targets = b.targets.to(device, /*non_blocking=*/true);
  return b;
}

EngineComms engine_comms(ProcessGroups& groups, const ShardingLayout& layout, bool deterministic,
                         CommCounters& counters) {
  EngineComms comms;
  comms.world = groups.world();
  comms.control = groups.control();
  const int S = layout.shard_group_size, R = layout.replicate_group_size;
  auto counted = [&](std::shared_ptr<Communicator> c) {
    auto wrapped = std::make_shared<CountingCommunicator>(std::move(c));
    counters.add(wrapped);
    return wrapped;
  };
  if (S > 1 && R > 1) {
    auto h = groups.hybrid(S);
    comms.shard = counted(h.shard);
    comms.replicate = counted(h.replicate);
  } else if (S > 1) {
    comms.shard = counted(groups.world());
  } else if (R > 1) {
    comms.replicate = counted(groups.world());
  }
  if (deterministic) comms.world = counted(groups.world());  // it carries the gradients then
  return comms;
}

bool runs_on_cpu(const Optimizer& opt) {
  const auto* d = dynamic_cast<const OptimizerDevices*>(&opt);
  return !d || d->runs_on_cpu();
}

std::vector<UnitSelection> select_units(Model& model, const WrapPolicy& wrap, const TrainSettings& s) {
  auto root = model.module();
  std::vector<UnitSelection> sel = wrap.select(*root);
  if (s.checkpoint_layer_types.empty()) return sel;
  const auto types = model.layer_types();
  std::map<std::string, std::string> type_of;
  for (const auto& m : root->named_modules("", /*include_self=*/false)) type_of[m.key()] = layer_type_name(*m.value());
  std::vector<std::string> unit_types;
  for (const auto& u : sel) unit_types.push_back(type_of[u.fqn]);
  for (const auto& t : s.checkpoint_layer_types) {
    if (std::find(types.begin(), types.end(), t) == types.end())
      throw Error("--activation-checkpointing " + t + ": the model has no layer type '" + t +
                  "'; its layer types are: " + join_names(types));
    bool any = false;
    for (auto& u : sel)
      if (type_of[u.fqn] == t) any = u.activation_checkpoint = true;
    if (!any)
      throw Error("--activation-checkpointing " + t + ": no unit is a " + t + " (the wrap policy's units are: " +
                  join_names(distinct(unit_types)) +
                  "); only units recompute, so make " + t + " a unit too (e.g. --wrap.layer_types " + t + ")");
  }
  return sel;
}

}  // namespace fsdpx
