// StepTrace: the events of a step as text, for a test to compare the engine's step with the
// memory plan's replay of it (step_order.h in the engine's sources has the order both follow).
#pragma once

#include <functional>
#include <string>

namespace fsdpx {

// "gather U" (an all-gather issued), "free U" (gathered parameters freed), "reduce U" (a
// reduction issued), "reduced U" (a reduction finished); U is the unit's path, "(root)" for the
// root. Unset: no events.
using StepTrace = std::function<void(const std::string& event)>;

}  // namespace fsdpx
