// The registry behind FSDPX_MODULE (fsdpx/unit.h): which layers may be units, and the hooks an
// engine installed for the layers that are. Thread-safe.
#pragma once

#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "fsdpx/export.h"
#include "fsdpx/unit.h"

namespace fsdpx {

// Installs `hooks[i]` for `modules[i]`, all or none. Throws fsdpx::Error naming `names[i]` when a
// module already has hooks (it is a unit of another live engine).
FSDPX_API void install_unit_hooks(const std::vector<const torch::nn::Module*>& modules,
                                  const std::vector<UnitHooks*>& hooks,
                                  const std::vector<std::string>& names);
// Removes the hooks of `modules` that are still `hooks` (an entry replaced since is left alone).
FSDPX_API void remove_unit_hooks(const std::vector<const torch::nn::Module*>& modules,
                                 const std::vector<UnitHooks*>& hooks);

}  // namespace fsdpx
