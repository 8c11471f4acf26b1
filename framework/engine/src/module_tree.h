// ModuleTree: a model's module tree walked once, with the wrap policy's selection checked, for
// plan_units and the engine alike: every module in pre-order, every parameter in its innermost
// enclosing unit (a tensor reachable twice is taken once, where it is first reached).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/wrap_policy.h"

namespace fsdpx {

struct ModuleTree {
  struct Unit {
    std::string fqn;  // "" for the root
    const torch::nn::Module* module = nullptr;
    bool recompute = false;  // activation checkpointing
    std::vector<std::pair<std::string, at::Tensor>> params;  // taken here, in module order
  };
  // A module reached from a second place: its second path and its first.
  struct Repeat {
    std::string fqn, first_fqn;
  };
  // A tensor registered again in another unit: its second name and unit, and its first.
  struct Tie {
    std::string param, unit, first_param, first_unit;
  };

  std::vector<Unit> units;  // the root first, then the selected units in module order
  std::vector<std::string> module_fqns;  // every submodule, in pre-order
  // What a planner passes over and the engine refuses (ShardingEngine's constructor): the first
  // of each, if any.
  std::optional<Repeat> repeated_module;
  std::optional<Tie> tie_across_units;

  // Walks `root` with `selected` as the units besides the root. Throws fsdpx::Error for the root
  // listed as a selection, a name listed twice or that is not a submodule (with the closest
  // name), and a unit inside a unit whose activations are recomputed.
  static ModuleTree walk(const torch::nn::Module& root, const std::vector<UnitSelection>& selected);

  // The units with their parameter counts, names and shapes.
  UnitPlan plan() const;
};

}  // namespace fsdpx
