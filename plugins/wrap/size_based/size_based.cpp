// size_based: PyTorch's size_based_auto_wrap_policy. Walking the module tree bottom-up, a
// submodule becomes a unit when the parameters under it that no nested unit has taken number at
// least min_num_params; those parameters then belong to it. What is left goes to the root.
// Only layers the engine can hook (declared with FSDPX_MODULE) are candidates; the parameters
// of any other module (a plain Linear, a ModuleList, which PyTorch excludes too) count toward
// the nearest candidate above it, or the root.
#include <algorithm>
#include <set>

#include <fsdpx/error.h>
#include <fsdpx/plugin.h>
#include <fsdpx/unit.h>
#include <fsdpx/wrap_policy.h>

namespace {

class SizeBasedWrap final : public fsdpx::WrapPolicy {
 public:
  explicit SizeBasedWrap(int64_t min_num_params) : min_num_params_(min_num_params) {}

  std::vector<fsdpx::UnitSelection> select(const torch::nn::Module& root) const override {
    std::set<const void*> seen;
    std::vector<fsdpx::UnitSelection> units;
    int64_t largest = 0;
    visit(root, "", seen, units, largest);  // what is left stays with the root
    if (units.empty())
      throw fsdpx::Error("size_based selected no unit: no wrappable layer holds min_num_params=" +
                         std::to_string(min_num_params_) + " parameters (the largest holds " +
                         std::to_string(largest) + "); lower min_num_params");
    return units;
  }

 private:
  // Returns the parameter elements under `m` not taken by a unit at or below it.
  int64_t visit(const torch::nn::Module& m, const std::string& fqn, std::set<const void*>& seen,
                std::vector<fsdpx::UnitSelection>& units, int64_t& largest) const {
    int64_t count = 0;
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      if (p.value().defined() && seen.insert(p.value().unsafeGetTensorImpl()).second)
        count += p.value().numel();
    }
    for (const auto& child : m.named_children()) {
      count += visit(*child.value(), fqn.empty() ? child.key() : fqn + "." + child.key(), seen, units, largest);
    }
    const bool candidate = !fqn.empty() && fsdpx::is_wrappable(m);
    if (candidate) largest = std::max(largest, count);
    if (candidate && count >= min_num_params_) {
      units.push_back({fqn, false});
      return 0;
    }
    return count;
  }

  int64_t min_num_params_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::WrapPolicy>(
      "size_based",
      "a submodule becomes a unit once the parameters under it that no nested unit took reach "
      "min_num_params (PyTorch's size_based_auto_wrap_policy)",
      {fsdpx::int_option("min_num_params", 100000000, fsdpx::IntRange{1},
                         "smallest number of parameter elements that makes a submodule a unit")},
      [](const fsdpx::ComponentContext& ctx) {
        return std::make_shared<SizeBasedWrap>(ctx.options.get_int("min_num_params"));
      });
}

}  // namespace

FSDPX_PLUGIN("wrap_size_based", "0.1.0", register_components)
