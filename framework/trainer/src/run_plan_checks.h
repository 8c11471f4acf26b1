// The run plan's checks across components: what a run would refuse before anything is
// allocated, in the order the components are created (so the first bad option named stays the
// same), and its documented no-ops. Used by plan_run (run_plan.cpp).
#pragma once

#include <memory>

#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/trainer/run_plan.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/interfaces.h"
#include "fsdpx/precision_policy.h"

namespace fsdpx {

// Components, layout and dtypes; the checks that need no data or model. Returns the precision
// policy it made, for the units' own dtypes (one per plan).
std::shared_ptr<PrecisionPolicy> plan_components(const PluginHost& host, const RunConfig& config,
                                                 const TrainSettings& s, RunPlan& plan);
// The data: opened as rank 0 would, so a missing file or a too-large batch is caught now; the
// samples and tokens of a step.
void plan_data(const PluginHost& host, const RunConfig& config, const TrainSettings& s, Model& model, RunPlan& plan);
// A precision policy's unit names (fsdpx::UnitNameCheck) against the run's units.
void check_unit_names(const RunConfig& config, const PrecisionPolicy& precision, const UnitPlan& up);
// An offloading strategy steps on the CPU: its optimizer must run there.
void check_offload_optimizer(const RunPlan& plan);
// --optimizer-in-backward against the optimizer and the precision policy.
void check_optimizer_in_backward(const PluginHost& host, const TrainSettings& s, const Optimizer& opt,
                                 const PrecisionPolicy& precision, RunPlan& plan);
// The documented no-ops of this run (RunPlan::not_applied).
void plan_not_applied(RunPlan& plan);

// A warning each where the plan does not fit the --cluster file's nodes: more ranks per node than
// it has accelerators, or a peak per rank above an accelerator's memory.
void check_against_cluster(RunPlan& plan);

}  // namespace fsdpx
