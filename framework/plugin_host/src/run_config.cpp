#include "fsdpx/framework/plugin_host/run_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <boost/program_options/parsers.hpp>

#include "fsdpx/error.h"
#include "fsdpx/files.h"
#include "fsdpx/framework/base/program_options.h"
#include "fsdpx/suggest.h"

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
    desc.add_options()(
        name_key(k).c_str(), po::value<std::string>()->value_name("NAME"),
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
  return parse_ini(read_config_file(file), desc, "config file " + file.string());
}

// Each key of an INI file's text ("steps", "model.size") and the line that first gives it.
std::map<std::string, int> ini_key_lines(const std::string& text) {
  std::map<std::string, int> lines;
  std::istringstream in(text);
  std::string section, line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = line.substr(0, line.find('#'));
    const size_t b = line.find_first_not_of(" \t\r"), e = line.find_last_not_of(" \t\r");
    if (b == std::string::npos) continue;
    line = line.substr(b, e - b + 1);
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2) + ".";
      continue;
    }
    std::string key = line.substr(0, line.find('='));
    key.erase(key.find_last_not_of(" \t") + 1);
    lines.emplace(section + key, n);
  }
  return lines;
}

// Where `key` of `file` is given: "config file FILE:LINE".
std::string file_origin(const fs::path& file, const std::map<std::string, int>& lines, const std::string& key) {
  auto it = lines.find(key);
  return "config file " + file.string() + (it == lines.end() ? "" : ":" + std::to_string(it->second));
}

// Refuses a key of the file's that only the command line may give, and `config`: a run reads one
// INI file, the one --config names on the command line, so a file naming another is never read.
void refuse_command_line_only(const po::parsed_options& parsed, const ConfigRequest& request, const fs::path& file) {
  const auto lines = ini_key_lines(read_config_file(file));
  for (const auto& o : parsed.options)
    if (o.string_key == "config")
      throw Error(file_origin(file, lines, "config") + ": config = " + (o.value.empty() ? "" : o.value.front()) +
                  " would never be read: a run reads one INI file, the one --config names on the command line; "
                  "merge the two files, or give --config " + (o.value.empty() ? "FILE" : o.value.front()) +
                  " on the command line");
  for (const auto& o : parsed.options)
    if (request.command_line_only.count(o.string_key))
      throw Error("config file " + file.string() + ": " + o.string_key + " is a command-line flag (--" + o.string_key +
                  "); an INI file cannot give it");
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
    throw Error("command line: " + option_error_text(e));
  }
}

void store_checked(const po::parsed_options& parsed, po::variables_map& vm, const std::string& origin) {
  try {
    po::store(parsed, vm);
  } catch (const po::error& e) {
    throw Error(origin + ": " + option_error_text(e));
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
    config_file = file;
    const po::parsed_options parsed = parse_file(file, pass1);
    refuse_command_line_only(parsed, request, file);
    store_checked(registered_only(parsed), vm1, "config file " + file.string());
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
  const po::parsed_options from_args = parse_args(args, all);
  store_known(host, from_args, "command line", chosen, all, vm);
  std::set<std::string> seen;
  for (const auto& o : from_args.options)
    if (seen.insert(o.string_key).second) config.given_.emplace_back(o.string_key, "command line --" + o.string_key);
  // (the file's entries: "config file FILE:LINE: key")
  if (config.config_file_) {
    const fs::path& file = *config.config_file_;
    const po::parsed_options from_file = parse_file(file, all);
    store_known(host, from_file, "config file " + file.string(), chosen, all, vm);
    const auto lines = ini_key_lines(read_config_file(file));
    for (const auto& o : from_file.options)  // the command line's wins
      if (seen.insert(o.string_key).second)
        config.given_.emplace_back(o.string_key, file_origin(file, lines, o.string_key) + ": " + o.string_key);
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error("command line: " + option_error_text(e));
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
  config.host_values_ = HostValues(std::move(vm));
  // Read here: --config and each component's name. Read by plugin_search(), which a host calls
  // before resolving: --plugin-dir, --plugin, --allow-insecure-plugin-dir, --skip-broken-plugins.
  for (const char* key : {"config", "plugin-dir", "plugin", "allow-insecure-plugin-dir", "skip-broken-plugins"})
    config.host_values_.mark_read(key);
  for (Kind k : all_kinds()) config.host_values_.mark_read(name_key(k));
  return config;
}

size_t HostValues::count(const std::string& key) const {
  read_->insert(key);
  return vm_.count(key);
}

const po::variable_value& HostValues::operator[](const std::string& key) const {
  read_->insert(key);
  return vm_[key];
}

namespace {

// The FSDPX_* environment variables a run reads (fsdpx-train, the plugin host, sim), and the prefix
// only sim's own settings use. Other FSDPX_* names belong to the build's and the scripts' tools.
const std::vector<std::string>& environment_settings() {
  static const std::vector<std::string> names = {
      "FSDPX_LOG",        "FSDPX_PLUGIN_PATH", "FSDPX_FAULT",       "FSDPX_LAUNCHED",         "FSDPX_PROGRESS",
      "FSDPX_SIM_MEMORY", "FSDPX_SIM_DEVICES", "FSDPX_SIM_LIBRARY", "FSDPX_SIM_PROTECT",      "FSDPX_SIM_CACHE",
      "FSDPX_SIM_POISON", "FSDPX_SIM_STREAM_CHECK", "FSDPX_CPU_BLOCK_CACHE", "FSDPX_CUDA_LIBRARY",
      "FSDPX_EXEC_WORKERS", "FSDPX_SHARE_GPUS"};
  return names;
}

// The first FSDPX_* variable of `environment` that looks meant for a run and is none of its
// settings (sim's prefix, or a misspelling of a setting), as a refusal naming the closest; or "".
std::string unknown_environment_setting(char** environment) {
  const auto& known = environment_settings();
  for (char** e = environment; e && *e; ++e) {
    const std::string entry = *e, name = entry.substr(0, entry.find('='));
    if (name.rfind("FSDPX_", 0) != 0 || std::find(known.begin(), known.end(), name) != known.end()) continue;
    const auto best = closest_name(name, known);
    if (best || name.rfind("FSDPX_SIM_", 0) == 0)
      return "environment: " + name + " is not a setting fsdpx reads, so it would change nothing; unset it" +
             (best ? ", or did you mean " + *best + "?" : " (the settings: " + join_names(known) + ")");
  }
  return "";
}

// "wrap.depth" -> "wrap policy 'size_based'" and "depth"; "" when `key` is not a chosen component's option.
std::string component_of(const RunConfig& config, const std::string& key, const Options*& options,
                         std::string& option) {
  const size_t dot = key.find('.');
  const auto kind = dot == std::string::npos ? std::nullopt : kind_from_section(key.substr(0, dot));
  const ComponentChoice* c = kind ? config.choice(*kind) : nullptr;
  if (!c || key.substr(dot + 1) == "name") return "";
  options = &c->options;
  option = key.substr(dot + 1);
  return std::string(kind_title(*kind)) + " '" + c->name + "'";
}

}  // namespace

std::string RunConfig::unread() const {
  std::vector<std::string> read;  // the keys this run read, for the closest one
  for (const auto& [kind, c] : components_)
    for (const auto& [name, text] : c.options.text())
      if (c.options.was_read(name)) read.push_back(std::string(section_name(kind)) + "." + name);
  for (const auto& [key, value] : host_values_.unmarked())
    if (host_values_.was_read(key) && key.find('.') == std::string::npos) read.push_back(key);
  for (const auto& [key, origin] : given_) {
    const Options* options = nullptr;
    std::string option;
    const std::string component = component_of(*this, key, options, option);
    if (options ? options->was_read(option) : host_values_.was_read(key)) continue;
    std::vector<std::string> others;
    for (const auto& r : read)
      if (r != key) others.push_back(r);
    const auto best = closest_name(key, others);
    return origin + " is accepted, but nothing in this run reads it" +
           (component.empty() ? std::string() : " (" + component + " does not use it in this configuration)") +
           "; drop it" + (best ? ", or did you mean " + *best + "?" : "");
  }
  return unknown_environment_setting(environ);
}

void RunConfig::refuse_unread() const {
  const std::string why = unread();
  if (!why.empty()) throw Error(why);
}

const ComponentChoice* RunConfig::choice(Kind kind) const {
  auto it = components_.find(kind);
  return it == components_.end() ? nullptr : &it->second;
}

std::string RunConfig::to_ini() const { return ini(false); }
std::string RunConfig::used_ini() const { return ini(true); }

std::string RunConfig::ini(bool used_only) const {
  std::ostringstream out;
  for (const char* key : {"plugin-dir", "plugin"}) {  // top-level keys: before the first section
    auto it = host_values_.unmarked().find(key);
    if (it == host_values_.unmarked().end() || it->second.value().type() != typeid(std::vector<std::string>))
      continue;
    for (const auto& p : it->second.as<std::vector<std::string>>())
      out << key << "=" << fs::absolute(p).lexically_normal().string() << "\n";
  }
  bool first = out.tellp() == 0;
  for (const auto& [kind, c] : components_) {
    out << (first ? "" : "\n") << "[" << section_name(kind) << "]\nname=" << c.name << "\n";
    for (const auto& [key, value] : c.options.text())
      if (!used_only || c.options.was_read(key)) out << key << "=" << value << "\n";
    first = false;
  }
  for (Kind kind : switched_off_) {  // kept off when the file is read again, whatever the defaults
    out << (first ? "" : "\n") << "[" << section_name(kind) << "]\nname=none\n";
    first = false;
  }
  return out.str();
}

std::string read_config_file(const fs::path& file) {
  constexpr uintmax_t kMaxBytes = 16 << 20;  // a run's INI file is a few KiB
  const std::string where = "config file " + file.string();
  const std::string kind = file_kind(file.string());
  if (kind == "missing") throw Error(where + " does not exist (--config)");
  if (kind == "a directory")
    throw Error(where + " is a directory (--config); give an INI file, such as a run directory's config.ini");
  if (kind == kSymlinkLoop) throw Error(where + " is " + kind + " (--config); point it at an INI file");
  if (kind == "unreadable") throw Error(where + " cannot be looked at (--config): a directory on its way forbids it");
  if (!kind.empty()) throw Error(where + " is " + kind + ", not a regular file (--config)");
  std::error_code ec;
  const uintmax_t size = fs::file_size(file, ec);
  if (!ec && size > kMaxBytes)
    throw Error(where + " is " + std::to_string(size >> 20) + " MiB, not a run's INI file (--config)");
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in) throw Error(where + " cannot be read (--config)");
  const std::string s = text.str();
  if (const size_t nul = s.find('\0'); nul != std::string::npos) {
    const auto line = 1 + std::count(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(nul), '\n');
    throw Error(where + ": line " + std::to_string(line) + " holds a NUL byte; an INI file is text (--config)");
  }
  return s;
}

PluginSearch plugin_search(const std::vector<std::string>& args, PluginSearch search) {
  std::optional<fs::path> config;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&](const std::string& flag) -> std::optional<std::string> {
      if (args[i] == flag && i + 1 < args.size()) return args[++i];
      if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
      return std::nullopt;
    };
    if (auto d = value("--plugin-dir")) search.dirs.emplace_back(*d);
    else if (auto f = value("--plugin")) search.files.emplace_back(*f);
    else if (auto c = value("--config")) config = *c;
    else if (args[i] == "--allow-insecure-plugin-dir") search.allow_insecure = true;
    else if (args[i] == "--skip-broken-plugins") search.skip_broken = true;
  }
  if (!config) return search;
  po::options_description keys;
  keys.add_options()("plugin-dir", po::value<std::vector<std::string>>())(
      "plugin", po::value<std::vector<std::string>>());
  for (const auto& o : parse_file(*config, keys).options) {
    if (o.unregistered || o.value.empty()) continue;
    (o.string_key == "plugin-dir" ? search.dirs : search.files).emplace_back(o.value.front());
  }
  return search;
}

po::options_description component_choice_options(const ConfigRequest& request) {
  po::options_description desc("Configuration and components (fsdpx-plugins list shows the installed ones)");
  add_common_options(desc, request.optional_kinds);
  return desc;
}

}  // namespace fsdpx
