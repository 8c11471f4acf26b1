// The trainer: a run composed from plugins (model, data, sharding, wrap, precision, optimizer,
// checkpoint), its plan before anything is allocated, and the training loop with the metrics a
// user reads. fsdpx-train is its command line.
#pragma once

#include <map>
#include <string>

#include "fsdpx/component.h"
#include "fsdpx/export.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/framework/trainer/run_plan.h"
#include "fsdpx/framework/trainer/train_settings.h"

namespace fsdpx {

// Trains. Collective: every rank calls it with the same configuration. Returns the exit status.
FSDPX_API int train(const PluginHost& host, const RunConfig& config, const TrainSettings& settings,
                    const RuntimeOptions& runtime);

// The components a run uses when the configuration does not choose one.
FSDPX_API std::map<Kind, std::string> default_components();

}  // namespace fsdpx
