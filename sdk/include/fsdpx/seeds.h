// fsdpx/seeds.h: seeds derived from names, the same value on every rank and at every world size.
// The engine seeds each parameter's initialisation this way (Model::init_parameter); a data
// source can draw sample i from parameter_seed(seed, "sample/" + i), so any rank at any world
// size reads the same sample i.
#pragma once

#include <cstdint>
#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

// The 64-bit seed of parameter (or any named stream) `name` under run seed `seed`: independent
// of rank and world size.
FSDPX_API uint64_t parameter_seed(uint64_t seed, const std::string& name);

}  // namespace fsdpx
