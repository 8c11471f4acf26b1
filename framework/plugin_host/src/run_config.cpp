#include "fsdpx/framework/plugin_host/run_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <boost/program_options/parsers.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/suggest.h"

namespace fsdpx {
namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

std::string name_key(Kind kind) { return std::string(section_name(kind)) + ".name"; }

// Options every resolution understands: --config and --<section>.name for each kind.
void add_common_options(po::options_description& desc, const std::set<Kind>& optional) {
  desc.add_options()("config", po::value<std::string>()->value_name("FILE"),
                     "INI file with the run's configuration; the command line wins over it");
  for (Kind k : all_kinds()) {
    desc.add_options()(name_key(k).c_str(), po::value<std::string>()->value_name("NAME"),
                       (std::string("the ") + kind_title(k) + " to use" + (optional.count(k) ? ", or none" : "")).c_str());
  }
}

// "none" leaves an optional kind out (recorded in `off`); an empty name, or none for a kind the
// host needs, is an error naming the fix.
void apply_none(std::map<Kind, std::string>& chosen, const std::set<Kind>& optional, std::set<Kind>& off) {
  for (auto it = chosen.begin(); it != chosen.end();) {
    const std::string key = "--" + name_key(it->first);
    const std::string title = kind_title(it->first);
    if (it->second.empty())
      throw Error(key + " is empty: give a " + title + "'s name (fsdpx-plugins list shows them)" +
                  (optional.count(it->first) ? ", or none to run without a " + title : std::string()));
    if (it->second != "none") {
      ++it;
      continue;
    }
    if (!optional.count(it->first))
      throw Error(key + " none: a run needs a " + title + "; give one's name (fsdpx-plugins list shows them)");
    off.insert(it->first);
    it = chosen.erase(it);
  }
}

std::vector<std::string> long_names(const po::options_description& desc) {
  std::vector<std::string> names;
  for (const auto& o : desc.options()) names.push_back(o->long_name());
  return names;
}

// Refuses an option that no description registered. One meant for a chosen component is
// refused by that component's checks, which name the plugin and suggest the closest option.
[[noreturn]] void reject_unregistered(const PluginHost& host, const std::string& key,
                                     const std::string& origin,
                                     const std::map<Kind, std::string>& chosen,
                                     const po::options_description& all) {
  auto dot = key.find('.');
  if (dot != std::string::npos) {
    if (auto kind = kind_from_section(key.substr(0, dot))) {
      if (auto it = chosen.find(*kind); it != chosen.end()) {
        host.options_for(*kind, it->second, {{key.substr(dot + 1), ""}});  // throws: not declared
      }
      throw Error(origin + ": option " + key + " needs a " + kind_title(*kind) +
                  ", but none is chosen; choose one with --" + name_key(*kind) + " NAME (or [" +
                  section_name(*kind) + "] name=NAME in the config file)");
    }
  }
  // Spelled as the user wrote it: --key on the command line, key under its [section] in a file.
  const std::string prefix = origin == "command line" ? "--" : "";
  auto best = closest_name(key, long_names(all));
  throw Error(origin + ": unknown option " + prefix + key +
              (best ? "; did you mean " + prefix + *best + "?" : "") + " (see --help for the options)");
}

po::parsed_options parse_file(const fs::path& file, const po::options_description& desc) {
  std::ifstream in(file);
  if (!in) throw Error("config file " + file.string() + " cannot be read (--config)");
  try {
    return po::parse_config_file(in, desc, /*allow_unregistered=*/true);
  } catch (const po::error& e) {
    throw Error("config file " + file.string() + ": " + e.what());
  }
}

po::parsed_options parse_args(const std::vector<std::string>& args,
                              const po::options_description& desc) {
  try {
    // No abbreviations: --sharding.reshard must not quietly mean reshard_after_forward.
    return po::command_line_parser(args)
        .options(desc)
        .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
        .allow_unregistered()
        .run();
  } catch (const po::error& e) {
    throw Error(std::string("command line: ") + e.what());
  }
}

void store_checked(const po::parsed_options& parsed, po::variables_map& vm, const std::string& origin) {
  try {
    po::store(parsed, vm);
  } catch (const po::error_with_option_name& e) {
    // Boost's what() replaces placeholders such as %value% in a loop that never ends when the
    // value holds one itself (found by tests/fuzz/fuzz_config): such a value gets this message.
    std::string name = e.get_option_name();
    name.erase(0, std::min(name.size(), name.find_first_not_of('-')));
    for (const auto& o : parsed.options)
      for (const auto& v : o.value)
        if (o.string_key == name && v.find('%') != std::string::npos)
          throw Error(origin + ": option '" + name + "' does not take the value '" + v + "'");
    throw Error(origin + ": " + e.what());
  } catch (const po::error& e) {
    throw Error(origin + ": " + e.what());
  }
}

// Copies the parsed options that a description registered (leaving the rest out).
po::parsed_options registered_only(const po::parsed_options& parsed) {
  po::parsed_options out(parsed.description, parsed.m_options_prefix);
  for (const auto& o : parsed.options) {
    if (!o.unregistered && o.position_key == -1) out.options.push_back(o);
  }
  return out;
}

}  // namespace

namespace {

// Pass 1: the host's options, --config and every --<section>.name, to learn which components
// (and so which component options) the run has. Sets `config_file` when --config names one.
std::map<Kind, std::string> choose_components(const std::vector<std::string>& args, const ConfigRequest& request,
                                              std::optional<fs::path>& config_file) {
  po::options_description common;
  add_common_options(common, request.optional_kinds);
  po::options_description pass1;
  if (request.host_options) pass1.add(*request.host_options);
  pass1.add(common);
  po::variables_map vm1;
  store_checked(registered_only(parse_args(args, pass1)), vm1, "command line");
  if (vm1.count("config")) {
    fs::path file = vm1["config"].as<std::string>();
    if (!fs::exists(file)) throw Error("config file " + file.string() + " does not exist (--config)");
    config_file = file;
    store_checked(registered_only(parse_file(file, pass1)), vm1, "config file " + file.string());
  }
  std::map<Kind, std::string> chosen;
  for (Kind k : all_kinds()) {
    if (vm1.count(name_key(k))) {
      chosen[k] = vm1[name_key(k)].as<std::string>();
    } else if (auto it = request.default_names.find(k); it != request.default_names.end()) {
      chosen[k] = it->second;
    }
  }
  return chosen;
}

// Every option a run with `chosen` accepts: the host's, the common ones, and each chosen
// component's declared options as --<section>.<option>.
po::options_description run_options(const PluginHost& host, const ConfigRequest& request,
                                    const std::map<Kind, std::string>& chosen) {
  po::options_description common;
  add_common_options(common, request.optional_kinds);
  po::options_description components;
  for (const auto& [kind, name] : chosen) {
    const ComponentRecord& c = host.find(kind, name);
    for (const auto& o : c.spec.options) {
      std::string key = std::string(section_name(kind)) + "." + o.name;
      components.add_options()(key.c_str(), po::value<std::string>()->value_name(type_name(o.type)), o.help.c_str());
    }
  }
  po::options_description all;
  if (request.host_options) all.add(*request.host_options);
  all.add(common).add(components);
  return all;
}

// Stores `parsed` (from `origin`) after refusing what `all` does not know, naming the closest.
void store_known(const PluginHost& host, const po::parsed_options& parsed, const std::string& origin,
                 const std::map<Kind, std::string>& chosen, const po::options_description& all, po::variables_map& vm) {
  for (const auto& o : parsed.options)
    if (o.unregistered) reject_unregistered(host, o.string_key, origin, chosen, all);
  for (const auto& o : parsed.options)
    if (o.position_key != -1)
      throw Error(origin + ": unexpected argument '" + o.value.front() +
                  "'; options take the form --<section>.<option> VALUE (see --help)");
  store_checked(registered_only(parsed), vm, origin);
}

}  // namespace

RunConfig RunConfig::resolve(const PluginHost& host, const std::vector<std::string>& args,
                             const ConfigRequest& request) {
  RunConfig config;
  std::map<Kind, std::string> chosen = choose_components(args, request, config.config_file_);
  apply_none(chosen, request.optional_kinds, config.switched_off_);
  // Pass 2: everything, with each chosen component's declared options registered.
  const po::options_description all = run_options(host, request, chosen);
  po::variables_map vm;
  store_known(host, parse_args(args, all), "command line", chosen, all, vm);
  if (config.config_file_) {
    const std::string origin = "config file " + config.config_file_->string();
    store_known(host, parse_file(*config.config_file_, all), origin, chosen, all, vm);
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(std::string("command line: ") + e.what());
  }
  for (const auto& [kind, name] : chosen) {
    const std::string prefix = std::string(section_name(kind)) + ".";
    std::map<std::string, std::string> mine;
    for (const auto& [key, value] : vm) {
      if (key.rfind(prefix, 0) == 0 && key != name_key(kind) && !value.defaulted())
        mine[key.substr(prefix.size())] = value.as<std::string>();
    }
    config.components_.emplace(kind, ComponentChoice{name, host.options_for(kind, name, mine)});
  }
  config.host_values_ = std::move(vm);
  return config;
}

const ComponentChoice* RunConfig::choice(Kind kind) const {
  auto it = components_.find(kind);
  return it == components_.end() ? nullptr : &it->second;
}

std::string RunConfig::to_ini() const {
  std::ostringstream out;
  bool first = true;
  for (const auto& [kind, c] : components_) {
    out << (first ? "" : "\n") << "[" << section_name(kind) << "]\nname=" << c.name << "\n";
    for (const auto& [key, value] : c.options.text()) out << key << "=" << value << "\n";
    first = false;
  }
  for (Kind kind : switched_off_) {  // kept off when the file is read again, whatever the defaults
    out << (first ? "" : "\n") << "[" << section_name(kind) << "]\nname=none\n";
    first = false;
  }
  return out.str();
}

po::options_description component_choice_options(const ConfigRequest& request) {
  po::options_description desc("Configuration and components (fsdpx-plugins list shows the installed ones)");
  add_common_options(desc, request.optional_kinds);
  return desc;
}

std::string describe_component(const ComponentRecord& c) {
  std::ostringstream out;
  const std::string section = section_name(c.spec.kind);
  out << kind_title(c.spec.kind) << " '" << c.spec.name << "' from plugin " << c.plugin->name
      << " " << c.plugin->version << " (" << c.plugin->path.string() << ")\n";
  if (!c.spec.help.empty()) out << "  " << c.spec.help << "\n";
  out << "\nchoose it with --" << section << ".name " << c.spec.name << "  or  [" << section
      << "] name=" << c.spec.name << "\n";
  if (c.spec.options.empty()) {
    out << "it has no options\n";
    return out.str();
  }
  out << "options: --" << section << ".<option> VALUE  or  <option>=VALUE under [" << section
      << "]\n\n";
  size_t wn = 6, wt = 4, wd = 7;
  auto type_of = [](const OptionSpec& o) {
    std::string t = type_name(o.type);
    if (o.type == OptionType::Choice) t += " {" + join_names(o.choices) + "}";
    return t;
  };
  for (const auto& o : c.spec.options) {
    wn = std::max(wn, o.name.size());
    wt = std::max(wt, type_of(o).size());
    wd = std::max(wd, o.default_value.size() + 2);
  }
  auto row = [&](const std::string& n, const std::string& t, const std::string& d,
                 const std::string& h) {
    out << "  " << n << std::string(wn - n.size() + 2, ' ') << t << std::string(wt - t.size() + 2, ' ')
        << d << std::string(wd - d.size() + 2, ' ') << h << "\n";
  };
  row("option", "type", "default", "help");
  for (const auto& o : c.spec.options) row(o.name, type_of(o), "'" + o.default_value + "'", o.help);
  return out.str();
}

}  // namespace fsdpx
