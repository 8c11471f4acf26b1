// UnitPlan: the sharding units a wrap policy chose, with their parameter counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdpx/export.h"
#include "fsdpx/wrap_policy.h"

namespace fsdpx {

struct UnitInfo {
  std::string fqn;  // "" for the root
  int64_t num_params = 0;   // elements of the parameters this unit gathers (not in nested units)
  int64_t num_tensors = 0;  // how many parameter tensors those are
  bool activation_checkpoint = false;
  std::vector<std::string> names;               // those tensors' names, in module order
  std::vector<std::vector<int64_t>> shapes;     // and their shapes (for planners and checkpoints)
};

struct FSDPX_API UnitPlan {
  std::vector<UnitInfo> units;  // the root first, then the selected units in module order
  int64_t total_params = 0;

  // One line per unit, then totals and the largest/smallest unit ratio.
  std::string table() const;
};

// Whether `path` (a module's or a parameter's) lies inside the unit at `unit` ("": the root, which
// holds everything).
inline bool within_unit(const std::string& unit, const std::string& path) {
  return unit.empty() || path == unit || path.rfind(unit + ".", 0) == 0;
}

// The index in `units` (each with an `fqn`; the root, "", first) of the innermost unit holding
// `path`: its parameters are gathered, and its work done, with that unit.
template <class Units>
size_t innermost_unit(const Units& units, const std::string& path) {
  size_t best = 0;
  for (size_t u = 1; u < units.size(); ++u)
    if (within_unit(units[u].fqn, path) && units[u].fqn.size() >= units[best].fqn.size()) best = u;
  return best;
}

// Checks `selected` against the module tree rooted at `root` and assigns every parameter to its
// innermost enclosing unit (a parameter reachable twice is counted once, where it is first
// reached). Throws fsdpx::Error for a name that is not a submodule, the root listed as a
// selection, a name listed twice, or a unit inside a recomputed one. The engine walks the tree the
// same way and refuses more (ShardingEngine's constructor).
FSDPX_API UnitPlan plan_units(const torch::nn::Module& root,
                              const std::vector<UnitSelection>& selected);

}  // namespace fsdpx
