#include "fsdpx/framework/engine/unit_plan.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/suggest.h"

namespace fsdpx {
namespace {

struct Walker {
  std::map<std::string, size_t> unit_index;  // selected fqn -> index into plan.units
  std::set<const void*> seen;                // parameters already assigned
  std::set<std::string> visited;             // module fqns reached
  UnitPlan* plan;

  void walk(const torch::nn::Module& m, const std::string& fqn, size_t unit) {
    visited.insert(fqn);
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      const at::Tensor& t = p.value();
      if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
      plan->units[unit].num_params += t.numel();
      plan->units[unit].num_tensors += 1;
      plan->units[unit].shapes.push_back(t.sizes().vec());
      plan->units[unit].names.push_back(fqn.empty() ? p.key() : fqn + "." + p.key());
      plan->total_params += t.numel();
    }
    for (const auto& child : m.named_children()) {
      const std::string child_fqn = fqn.empty() ? child.key() : fqn + "." + child.key();
      auto it = unit_index.find(child_fqn);
      if (it != unit_index.end() && plan->units[unit].activation_checkpoint)
        throw Error("unit '" + child_fqn + "' is inside '" + plan->units[unit].fqn +
                    "', whose activations are recomputed in backward; a recomputed unit cannot hold other units "
                    "(recompute the inner layer type instead, or do not make it a unit)");
      walk(*child.value(), child_fqn, it == unit_index.end() ? unit : it->second);
    }
  }
};

}  // namespace

UnitPlan plan_units(const torch::nn::Module& root, const std::vector<UnitSelection>& selected) {
  UnitPlan plan;
  plan.units.push_back(UnitInfo{"", 0, 0, false, {}, {}});
  Walker w;
  w.plan = &plan;
  for (const auto& s : selected) {
    if (s.fqn.empty()) throw Error("the wrap policy selected the root module; the root is always a unit and is not listed");
    if (w.unit_index.count(s.fqn)) throw Error("the wrap policy selected '" + s.fqn + "' twice");
    w.unit_index[s.fqn] = 0;  // index fixed below, in module order
  }
  // Order units as the modules appear (pre-order), so the plan reads like the model.
  std::vector<std::string> order;
  std::function<void(const torch::nn::Module&, const std::string&)> list =
      [&](const torch::nn::Module& m, const std::string& fqn) {
        for (const auto& child : m.named_children()) {
          const std::string child_fqn = fqn.empty() ? child.key() : fqn + "." + child.key();
          if (w.unit_index.count(child_fqn)) order.push_back(child_fqn);
          list(*child.value(), child_fqn);
        }
      };
  list(root, "");
  std::map<std::string, bool> checkpoint;
  for (const auto& s : selected) checkpoint[s.fqn] = s.activation_checkpoint;
  for (const auto& fqn : order) {
    w.unit_index[fqn] = plan.units.size();
    plan.units.push_back(UnitInfo{fqn, 0, 0, checkpoint[fqn], {}, {}});
  }
  if (order.size() != selected.size()) {
    std::vector<std::string> all;
    std::function<void(const torch::nn::Module&, const std::string&)> names =
        [&](const torch::nn::Module& m, const std::string& fqn) {
          for (const auto& child : m.named_children()) {
            const std::string child_fqn = fqn.empty() ? child.key() : fqn + "." + child.key();
            all.push_back(child_fqn);
            names(*child.value(), child_fqn);
          }
        };
    names(root, "");
    for (const auto& s : selected) {
      if (std::find(order.begin(), order.end(), s.fqn) == order.end())
        throw Error("the wrap policy selected '" + s.fqn + "', which is not a submodule of the model" +
                    did_you_mean(s.fqn, all));
    }
  }
  w.walk(root, "", 0);
  return plan;
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
