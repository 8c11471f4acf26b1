// describe_component: the table `fsdpx-plugins show KIND NAME` prints, a component's options
// with their types, ranges and defaults.
#include "fsdpx/framework/plugin_host/run_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "fsdpx/suggest.h"

namespace fsdpx {

namespace {

// A numeric option's declared range, for the type column: " in [0, 65536]", " >= 1", " > 0".
std::string range_text(const OptionSpec& o) {
  auto text = [](double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  };
  if (auto r = int_range(o)) {
    constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
    if (r->max == kMax) return r->min == kMin ? std::string() : " >= " + std::to_string(r->min);
    if (r->min == kMin) return " <= " + std::to_string(r->max);
    return " in [" + std::to_string(r->min) + ", " + std::to_string(r->max) + "]";
  }
  if (auto r = float_range(o)) {
    const bool lo = std::isfinite(r->min), hi = std::isfinite(r->max);
    if (lo && !hi) return (r->min_open ? " > " : " >= ") + text(r->min);
    if (!lo && hi) return (r->max_open ? " < " : " <= ") + text(r->max);
    if (lo && hi)
      return std::string(" in ") + (r->min_open ? "(" : "[") + text(r->min) + ", " + text(r->max) +
             (r->max_open ? ")" : "]");
  }
  return "";
}

}  // namespace

std::string describe_component(const ComponentRecord& c) {
  std::ostringstream out;
  const std::string section = section_name(c.spec.kind);
  out << kind_title(c.spec.kind) << " '" << c.spec.name << "' from plugin " << c.plugin->name << " "
      << c.plugin->version << " (" << c.plugin->path.string() << ")\n";
  if (!c.spec.help.empty()) out << "  " << c.spec.help << "\n";
  out << "\nchoose it with --" << section << ".name " << c.spec.name << "  or  [" << section << "] name=" << c.spec.name
      << "\n";
  if (c.spec.options.empty()) {
    out << "it has no options\n";
    return out.str();
  }
  out << "options: --" << section << ".<option> VALUE  or  <option>=VALUE under [" << section << "]\n\n";
  size_t wn = 6, wt = 4, wd = 7;
  auto type_of = [](const OptionSpec& o) {
    std::string t = type_name(o.type);
    if (o.type == OptionType::Choice) t += " {" + join_names(o.choices) + "}";
    t += range_text(o);
    return t;
  };
  for (const auto& o : c.spec.options) {
    wn = std::max(wn, o.name.size());
    wt = std::max(wt, type_of(o).size());
    wd = std::max(wd, o.default_value.size() + 2);
  }
  auto row = [&](const std::string& n, const std::string& t, const std::string& d, const std::string& h) {
    out << "  " << n << std::string(wn - n.size() + 2, ' ') << t << std::string(wt - t.size() + 2, ' ') << d
        << std::string(wd - d.size() + 2, ' ') << h << "\n";
  };
  row("option", "type", "default", "help");
  for (const auto& o : c.spec.options) row(o.name, type_of(o), "'" + o.default_value + "'", o.help);
  return out.str();
}

}  // namespace fsdpx
