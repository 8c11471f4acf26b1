// The units a run trains: the wrap policy's, with --activation-checkpointing applied.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/interfaces.h"

namespace fsdpx {

// The wrap policy's units, with --activation-checkpointing applied: units whose layer type is
// named recompute their activations. Throws fsdpx::Error naming a type the model lacks or that
// no unit has.
std::vector<UnitSelection> select_units(Model& model, const WrapPolicy& wrap, const LayerTypeChoices& s);

// The units of `selected` whose inputs move to host memory (--activation-offload): those whose
// layer type is named. Throws fsdpx::Error naming a type the model lacks (with the closest) or one
// that --activation-checkpointing does not name (only a recomputed unit's inputs can move).
std::set<std::string> offloaded_units(Model& model, const std::vector<UnitSelection>& selected,
                                      const LayerTypeChoices& s);

}  // namespace fsdpx
