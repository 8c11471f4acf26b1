// fqn_regex: every submodule whose fully-qualified name (as in named_modules(), e.g.
// "layers.3") matches the regular expression `pattern` as a whole becomes a unit.
#include <regex>

#include <fsdpx/error.h>
#include <fsdpx/plugin.h>
#include <fsdpx/wrap_policy.h>

namespace {

class FqnRegexWrap final : public fsdpx::WrapPolicy {
 public:
  FqnRegexWrap(std::string text, std::regex re) : text_(std::move(text)), re_(std::move(re)) {}

  std::vector<fsdpx::UnitSelection> select(const torch::nn::Module& root) const override {
    std::vector<fsdpx::UnitSelection> units;
    std::vector<std::string> names;
    visit(root, "", units, names);
    if (units.empty()) {
      std::string some;
      for (size_t i = 0; i < names.size() && i < 8; ++i) some += (i ? ", " : "") + names[i];
      throw fsdpx::Error("fqn_regex selected no unit: pattern '" + text_ +
                         "' matches no submodule name; names look like: " + some);
    }
    return units;
  }

 private:
  void visit(const torch::nn::Module& m, const std::string& fqn, std::vector<fsdpx::UnitSelection>& units,
             std::vector<std::string>& names) const {
    for (const auto& c : m.named_children()) {
      const std::string child = fqn.empty() ? c.key() : fqn + "." + c.key();
      names.push_back(child);
      if (std::regex_match(child, re_)) units.push_back({child, false});
      visit(*c.value(), child, units, names);
    }
  }
  std::string text_;
  std::regex re_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::WrapPolicy>(
      "fqn_regex", "every submodule whose full name matches a regular expression is a unit",
      {fsdpx::string_option("pattern", "",
                            "ECMAScript regular expression matched against the whole name, e.g. layers\\.[0-9]+")},
      [](const fsdpx::ComponentContext& ctx) {
        const std::string text = ctx.options.get_string("pattern");
        if (text.empty()) throw fsdpx::Error("pattern is empty; give one, e.g. --wrap.pattern 'layers\\.[0-9]+'");
        try {
          return std::make_shared<FqnRegexWrap>(text, std::regex(text));
        } catch (const std::regex_error& e) {
          throw fsdpx::Error("pattern '" + text + "' is not a valid regular expression: " + e.what());
        }
      });
}

}  // namespace

FSDPX_PLUGIN("wrap_fqn_regex", "0.1.0", register_components)
