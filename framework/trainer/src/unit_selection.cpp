#include "unit_selection.h"

#include <algorithm>
#include <map>
#include <string>

#include "fsdpx/error.h"
#include "fsdpx/suggest.h"

namespace fsdpx {

namespace {

std::map<std::string, std::string> layer_type_by_path(Model& model) {
  std::map<std::string, std::string> type_of;
  for (const auto& m : model.module()->named_modules("", /*include_self=*/false))
    type_of[m.key()] = layer_type_name(*m.value());
  return type_of;
}

}  // namespace

std::set<std::string> offloaded_units(Model& model, const std::vector<UnitSelection>& selected,
                                      const LayerTypeChoices& s) {
  std::set<std::string> units;
  if (s.offload.empty()) return units;
  const auto types = model.layer_types();
  auto type_of = layer_type_by_path(model);
  for (const auto& t : s.offload) {
    if (std::find(types.begin(), types.end(), t) == types.end())
      throw Error("--activation-offload " + t + ": the model has no layer type '" + t + "'; its layer types are: " +
                  join_names(types) + did_you_mean(t, types));
    const auto& ckpt = s.recompute;
    if (std::find(ckpt.begin(), ckpt.end(), t) == ckpt.end())
      throw Error("--activation-offload " + t + ": " + t + " does not recompute its activations, and only a "
                  "recomputed unit's inputs can move (LibTorch's C++ autograd has no saved-tensor hooks); add " + t +
                  " to --activation-checkpointing too");
    for (const auto& u : selected)
      if (type_of[u.fqn] == t) units.insert(u.fqn);
  }
  return units;
}

std::vector<UnitSelection> select_units(Model& model, const WrapPolicy& wrap, const LayerTypeChoices& s) {
  auto root = model.module();
  std::vector<UnitSelection> sel = wrap.select(*root);
  if (s.recompute.empty()) return sel;
  const auto types = model.layer_types();
  auto type_of = layer_type_by_path(model);
  std::vector<std::string> unit_types;
  for (const auto& u : sel) unit_types.push_back(type_of[u.fqn]);
  for (const auto& t : s.recompute) {
    if (std::find(types.begin(), types.end(), t) == types.end())
      throw Error("--activation-checkpointing " + t + ": the model has no layer type '" + t +
                  "'; its layer types are: " + join_names(types));
    bool any = false;
    for (auto& u : sel)
      if (type_of[u.fqn] == t) any = u.activation_checkpoint = true;
    if (!any && sel.empty())
      throw Error("--activation-checkpointing " + t +
                  ": the wrap policy makes no unit but the root, and only units "
                  "below it recompute; make " +
                  t + " a unit (--wrap.name layer_type --wrap.layer_types " + t +
                  "), or drop --activation-checkpointing");
    if (!any)
      throw Error("--activation-checkpointing " + t + ": no unit is a " + t + " (the wrap policy's units are: " +
                  join_names(distinct(unit_types)) +
                  "); only units recompute, so make " + t + " a unit too (e.g. --wrap.layer_types " + t + ")");
  }
  return sel;
}

}  // namespace fsdpx
