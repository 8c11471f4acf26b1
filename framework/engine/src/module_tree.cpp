#include "module_tree.h"

#include <algorithm>
#include <map>
#include <set>

#include "fsdpx/error.h"
#include "fsdpx/suggest.h"

namespace fsdpx {
namespace {

std::string child_fqn(const std::string& fqn, const std::string& name) { return fqn.empty() ? name : fqn + "." + name; }

class Walker {
 public:
  Walker(ModuleTree& tree, const std::map<std::string, bool>& chosen) : tree_(tree), chosen_(chosen) {}

  void walk(const torch::nn::Module& m, const std::string& fqn, size_t unit) {
    auto [it, fresh] = modules_.emplace(&m, fqn);
    if (!fresh && !tree_.repeated_module) tree_.repeated_module = ModuleTree::Repeat{fqn, it->second};
    if (!fqn.empty()) tree_.module_fqns.push_back(fqn);
    if (!fqn.empty() && chosen_.count(fqn)) unit = start_unit(m, fqn, unit);
    for (const auto& p : m.named_parameters(/*recurse=*/false)) add_param(child_fqn(fqn, p.key()), p.value(), unit);
    for (const auto& c : m.named_children()) walk(*c.value(), child_fqn(fqn, c.key()), unit);
  }

  // A unit inside a recomputed one, if any: (inner, outer).
  const std::optional<std::pair<std::string, std::string>>& nested_in_recompute() const { return nested_; }

 private:
  size_t start_unit(const torch::nn::Module& m, const std::string& fqn, size_t outer) {
    const ModuleTree::Unit& o = tree_.units[outer];
    if (o.recompute && !nested_) nested_ = std::make_pair(fqn, o.fqn);
    tree_.units.push_back(ModuleTree::Unit{fqn, &m, chosen_.at(fqn), {}});
    return tree_.units.size() - 1;
  }

  void add_param(const std::string& name, const at::Tensor& t, size_t unit) {
    if (!t.defined()) return;
    auto [it, fresh] = params_.emplace(t.unsafeGetTensorImpl(), std::make_pair(name, unit));
    if (fresh) {
      tree_.units[unit].params.emplace_back(name, t);
    } else if (it->second.second != unit && !tree_.tie_across_units) {
      tree_.tie_across_units =
          ModuleTree::Tie{name, tree_.units[unit].fqn, it->second.first, tree_.units[it->second.second].fqn};
    }
  }

  ModuleTree& tree_;
  const std::map<std::string, bool>& chosen_;
  std::map<const torch::nn::Module*, std::string> modules_;
  std::map<const c10::TensorImpl*, std::pair<std::string, size_t>> params_;  // -> (first name, unit)
  std::optional<std::pair<std::string, std::string>> nested_;
};

}  // namespace

ModuleTree ModuleTree::walk(const torch::nn::Module& root, const std::vector<UnitSelection>& selected) {
  std::map<std::string, bool> chosen;  // unit -> recomputes
  for (const auto& s : selected) {
    if (s.fqn.empty())
      throw Error("the wrap policy selected the root module; the root is always a unit and is not listed");
    if (!chosen.emplace(s.fqn, s.activation_checkpoint).second)
      throw Error("the wrap policy selected '" + s.fqn + "' twice");
  }
  ModuleTree tree;
  tree.units.push_back(Unit{"", &root, false, {}});
  Walker walker(tree, chosen);
  walker.walk(root, "", 0);
  for (const auto& s : selected)
    if (std::find(tree.module_fqns.begin(), tree.module_fqns.end(), s.fqn) == tree.module_fqns.end())
      throw Error("the wrap policy selected '" + s.fqn + "', which is not a submodule of the model" +
                  did_you_mean(s.fqn, tree.module_fqns));
  if (const auto& nested = walker.nested_in_recompute())
    throw Error("unit '" + nested->first + "' is inside '" + nested->second +
                "', whose activations are recomputed in backward; a recomputed unit cannot hold other units "
                "(recompute the inner layer type instead, or do not make it a unit)");
  return tree;
}

UnitPlan ModuleTree::plan() const {
  UnitPlan plan;
  for (const Unit& u : units) {
    UnitInfo info{u.fqn, 0, 0, u.recompute, {}, {}};
    for (const auto& [name, t] : u.params) {
      info.num_params += t.numel();
      info.num_tensors += 1;
      info.names.push_back(name);
      info.shapes.push_back(t.sizes().vec());
    }
    plan.total_params += info.num_params;
    plan.units.push_back(std::move(info));
  }
  return plan;
}

}  // namespace fsdpx
