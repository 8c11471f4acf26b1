// The plan as JSON: plan.json, and the "plan" of summary.json.
#pragma once

#include <nlohmann/json.hpp>

#include "fsdpx/framework/trainer/run_plan.h"

namespace fsdpx {

nlohmann::json plan_json(const RunPlan& plan);

}  // namespace fsdpx
