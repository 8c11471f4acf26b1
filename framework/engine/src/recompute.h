// Activation checkpointing of one unit (the Recompute autograd Function). Forward runs the
// unit's forward without recording a graph and keeps only its inputs; backward (after the unit's
// pre-backward has gathered its parameters again) runs the forward once more with a graph and
// differentiates it, returning the inputs' gradients and the parameters' (which autograd
// accumulates into their .grad as usual, so the unit's post-backward reduces them). The
// parameters are arguments so that the output has a history even when no input needs a
// gradient. The CPU generator's state is replayed, so dropout draws the same numbers twice.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace fsdpx {

struct Unit;

// Runs `unit.recompute` on `defined` (the defined tensor arguments, placed by
// unit.recompute_slots) under the Recompute function.
at::Tensor run_recomputed(Unit& unit, const std::vector<at::Tensor>& defined);

}  // namespace fsdpx
