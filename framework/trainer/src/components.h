// A run's components, created from its configuration, and the units it trains.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fsdpx/error.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/interfaces.h"
#include "comm_counters.h"

namespace fsdpx {

// The configuration's choice for `kind`; throws fsdpx::Error asking for --<section>.name.
const ComponentChoice& chosen(const RunConfig& config, Kind kind);

// The chosen component of T's kind, created with its options; errors name the component once
// (PluginHost::create does: "optimizer 'adamw' (plugin optimizer_adamw): ...").
template <class T>
std::shared_ptr<T> make(const PluginHost& host, const RunConfig& config) {
  const ComponentChoice& c = chosen(config, T::kKind);
  return host.create<T>(c.name, c.options);
}

// The wrap policy's units, with --activation-checkpointing applied: units whose layer type is
// named recompute their activations. Throws fsdpx::Error naming a type the model lacks or that
// no unit has.
std::vector<UnitSelection> select_units(Model& model, const WrapPolicy& wrap, const TrainSettings& s);

// The engine's communicators for `layout` over `groups`, each counted into `counters`: the shard
// and replicate groups, and (deterministic mode, where it carries the gradients) the world.
// `b` with its tensors on `device` (the CPU: as it is).
Batch on_device(Batch b, const c10::Device& device);

EngineComms engine_comms(ProcessGroups& groups, const ShardingLayout& layout, bool deterministic,
                         CommCounters& counters);

// Whether `opt` can step on the CPU (fsdpx/capabilities.h; yes unless it says otherwise).
bool runs_on_cpu(const Optimizer& opt);

}  // namespace fsdpx
