// The one rule on a unit's own dtypes, checked by the engine and by the run plan alike.
#pragma once

#include <string>

#include "fsdpx/export.h"
#include "fsdpx/precision_policy.h"

namespace fsdpx {

// Units may compute and reduce in dtypes of their own, but store their shards and gradients as
// the root does (one dtype for the optimizer and checkpoints). Throws fsdpx::Error naming unit
// `fqn`'s dtypes (`unit`) and the root's (`root`) otherwise.
FSDPX_API void check_unit_precision(const std::string& fqn, const PrecisionSpec& unit, const PrecisionSpec& root);

}  // namespace fsdpx
