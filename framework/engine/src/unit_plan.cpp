#include "fsdpx/framework/engine/unit_plan.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "module_tree.h"

namespace fsdpx {

UnitPlan plan_units(const torch::nn::Module& root, const std::vector<UnitSelection>& selected) {
  return ModuleTree::walk(root, selected).plan();
}

std::string UnitPlan::table() const {
  std::ostringstream out;
  size_t width = 6;
  for (const auto& u : units) width = std::max(width, u.fqn.empty() ? size_t(6) : u.fqn.size());
  char line[512];
  std::snprintf(line, sizeof line, "  %-*s  %14s  %8s  %s\n", int(width), "unit", "parameters",
                "tensors", "recompute");
  out << line;
  int64_t largest = 0, smallest = -1;
  for (const auto& u : units) {
    std::snprintf(line, sizeof line, "  %-*s  %14lld  %8lld  %s\n", int(width),
                  u.fqn.empty() ? "(root)" : u.fqn.c_str(), static_cast<long long>(u.num_params),
                  static_cast<long long>(u.num_tensors), u.activation_checkpoint ? "yes" : "no");
    out << line;
    if (u.num_params > 0) {
      largest = std::max(largest, u.num_params);
      smallest = smallest < 0 ? u.num_params : std::min(smallest, u.num_params);
    }
  }
  out << "  " << units.size() << " units, " << total_params << " parameters";
  if (smallest > 0) {
    std::snprintf(line, sizeof line, "; largest/smallest unit = %.2f",
                  static_cast<double>(largest) / static_cast<double>(smallest));
    out << line;
  }
  out << "\n";
  return out.str();
}

}  // namespace fsdpx
