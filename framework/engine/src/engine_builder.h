// Building an engine's units (engine_builder.cpp).
#pragma once

#include <vector>

#include "engine_state.h"

namespace fsdpx {

// Builds the units of `e` from the model and the wrap policy's selection, checks that every rank
// built the same, shards and initialises the parameters, and installs the units' hooks.
void build_engine(ShardingEngine::Impl& e, const std::vector<UnitSelection>& selected);

}  // namespace fsdpx
