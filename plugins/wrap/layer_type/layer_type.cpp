// layer_type: every submodule whose class is one of layer_types becomes a unit (PyTorch's
// transformer_auto_wrap_policy). A class is its module name (torch::nn::Module("Block")) or its
// C++ type name without namespaces and a trailing "Impl". With activation_checkpointing, every
// unit it makes recomputes its activations in backward (apply_activation_checkpointing with
// the same check_fn).
#include <set>

#include <fsdpx/error.h>
#include <fsdpx/plugin.h>
#include <fsdpx/wrap_policy.h>

namespace {

class LayerTypeWrap final : public fsdpx::WrapPolicy {
 public:
  LayerTypeWrap(std::vector<std::string> types, bool recompute)
      : types_(types.begin(), types.end()), recompute_(recompute) {}

  std::vector<fsdpx::UnitSelection> select(const torch::nn::Module& root) const override {
    std::vector<fsdpx::UnitSelection> units;
    std::set<std::string> present;
    visit(root, "", units, present);
    if (units.empty()) {
      std::string list;
      for (const auto& p : present) list += (list.empty() ? "" : ", ") + p;
      std::string wanted;
      for (const auto& t : types_) wanted += (wanted.empty() ? "" : ", ") + t;
      throw fsdpx::Error("layer_type selected no unit: no submodule is a " + wanted +
                         "; the model's submodule types are: " + list);
    }
    return units;
  }

 private:
  void visit(const torch::nn::Module& m, const std::string& fqn, std::vector<fsdpx::UnitSelection>& units,
             std::set<std::string>& present) const {
    for (const auto& c : m.named_children()) {
      const std::string child = fqn.empty() ? c.key() : fqn + "." + c.key();
      const std::string type = fsdpx::layer_type_name(*c.value());
      present.insert(type);
      if (types_.count(type)) units.push_back({child, recompute_});
      visit(*c.value(), child, units, present);
    }
  }
  std::set<std::string> types_;
  bool recompute_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::WrapPolicy>(
      "layer_type", "every submodule of the given layer types is a unit (PyTorch's transformer_auto_wrap_policy)",
      {fsdpx::list_option("layer_types", "Block", "layer class names, comma-separated, e.g. Block"),
       fsdpx::flag_option("activation_checkpointing", false,
                          "recompute every unit's activations in backward instead of storing them")},
      [](const fsdpx::ComponentContext& ctx) {
        auto types = ctx.options.get_list("layer_types");
        if (types.empty()) throw fsdpx::Error("layer_types is empty; name at least one layer class, e.g. Block");
        return std::make_shared<LayerTypeWrap>(types, ctx.options.get_bool("activation_checkpointing"));
      });
}

}  // namespace

FSDPX_PLUGIN("wrap_layer_type", "0.1.0", register_components)
