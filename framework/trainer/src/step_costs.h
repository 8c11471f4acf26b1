// What each part of a planned step costs in seconds on the given hardware (hardware.h), for the
// time model the memory plan's replay carries (fsdpx/framework/engine/step_time.h).
#pragma once

#include "fsdpx/framework/engine/step_time.h"
#include "fsdpx/framework/trainer/run_plan.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/model.h"
#include "hardware.h"

namespace fsdpx {

// The layers' costs from the model's LayerWork (else from flops_per_token, shared by the units'
// parameters), each unit's collectives from its bytes over the link its group spans, the
// optimizer from the seconds per element `optimizer_seconds_per_element` timed here (0: from its
// bytes). `plan` holds the units, the layout and the batch; `batch` samples per forward.
StepCosts step_costs(const RunPlan& plan, const Model& model, Hardware& hw, int64_t batch,
                     double optimizer_bytes_per_element);

// The hardware a plan predicts on: --cluster's file, else this machine's CPU (probed) where the
// run computes on it; else null, and `why` says so.
std::unique_ptr<Hardware> planning_hardware(const TrainSettings& s, const RunPlan& plan, std::string& why);

}  // namespace fsdpx
