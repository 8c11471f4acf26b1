// What the run's engine communicates over, and what it computes on: its communicators over the
// run's process groups, and a batch on its device.
#pragma once

#include <memory>

#include "fsdpx/framework/engine/engine_options.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/interfaces.h"
#include "comm_counters.h"

namespace fsdpx {

// The engine's communicators for `options`' layout over `groups`, each counted into `counters`:
// the shard and replicate groups, (deterministic mode, where it carries the gradients) the world,
// and the post-forward groups of k consecutive ranks.
EngineComms engine_comms(ProcessGroups& groups, const EngineOptions& options, CommCounters& counters);

// The engine over `model`: the wrap policy's units (select_units: with s's recompute), its
// communicators over `groups` (engine_comms). The one
// way fsdpx-train and fsdpx::fully_shard build theirs.
std::unique_ptr<ShardingEngine> build_engine(std::shared_ptr<Model> model, const WrapPolicy& wrap,
                                             const LayerTypeChoices& s, ProcessGroups& groups, EngineOptions options,
                                             CommCounters& counters);
// `b` with its tensors on `device` (the CPU: as it is).
Batch on_device(Batch b, const c10::Device& device);

}  // namespace fsdpx
