// top_level: every direct child of the model that holds at least min_num_params parameter
// elements becomes a sharding unit; the rest stays with the root. A minimal, complete fsdpx
// plugin: one component, one option, one check.
#include <fsdpx/error.h>
#include <fsdpx/plugin.h>
#include <fsdpx/wrap_policy.h>

namespace {

class TopLevelWrap final : public fsdpx::WrapPolicy {
 public:
  explicit TopLevelWrap(int64_t min_num_params) : min_num_params_(min_num_params) {}

  std::vector<fsdpx::UnitSelection> select(const torch::nn::Module& root) const override {
    std::vector<fsdpx::UnitSelection> units;
    for (const auto& child : root.named_children()) {
      int64_t n = 0;
      for (const auto& p : child.value()->parameters()) n += p.numel();
      if (n >= min_num_params_) units.push_back({child.key(), false});
    }
    return units;
  }

 private:
  int64_t min_num_params_;
};

void register_components(fsdpx::Registrar& registrar) {
  registrar.add<fsdpx::WrapPolicy>(
      "top_level", "each direct child of the model with enough parameters is a unit",
      // A numeric option declares its range; the host refuses a value outside it, naming it.
      {fsdpx::int_option("min_num_params", 1, fsdpx::IntRange{0}, "smallest child (parameter elements) to wrap")},
      [](const fsdpx::ComponentContext& ctx) {
        return std::make_shared<TopLevelWrap>(ctx.options.get_int("min_num_params"));
      });
}

}  // namespace

FSDPX_PLUGIN("example_top_level_wrap", "1.0.0", register_components)
