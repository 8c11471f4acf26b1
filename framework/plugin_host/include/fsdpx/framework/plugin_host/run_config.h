// RunConfig: a run's chosen components and their options, from the command line and an INI file.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options/options_description.hpp>
#include <boost/program_options/variables_map.hpp>

#include "fsdpx/component.h"
#include "fsdpx/export.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/options.h"

namespace fsdpx {

struct ComponentChoice {
  std::string name;
  Options options;
};

// What a host asks of the resolver.
struct ConfigRequest {
  // The host's own options (e.g. --steps). The resolver adds --config FILE and, for every
  // kind, --<section>.name and the chosen component's options.
  const boost::program_options::options_description* host_options = nullptr;
  // The component used for a kind that neither the command line nor the file chooses.
  std::map<Kind, std::string> default_names;
  // Kinds the host can do without: --<section>.name none (or [section] name=none) leaves the
  // run without one, e.g. fsdpx-train's checkpoint. `none` for any other kind is an error.
  std::set<Kind> optional_kinds;
  // Host options that only the command line may give (actions, a launcher's flags): an INI file
  // holding one is refused, naming it, instead of being accepted and ignored.
  std::set<std::string> command_line_only = {};
};

// The host's own option values (boost's variables_map), read through count() and operator[],
// which mark the key as read: a key the user gave that nothing read is refused when the run is
// planned (RunConfig::refuse_unread). Copies share the marks.
class FSDPX_API HostValues {
 public:
  HostValues() = default;
  explicit HostValues(boost::program_options::variables_map vm) : vm_(std::move(vm)) {}
  // As variables_map's, marking `key` read.
  size_t count(const std::string& key) const;
  const boost::program_options::variable_value& operator[](const std::string& key) const;
  bool was_read(const std::string& key) const { return read_->count(key) > 0; }
  // Marks keys a host consumed elsewhere (e.g. plugin_search() reads --plugin-dir from the raw arguments).
  void mark_read(const std::string& key) const { read_->insert(key); }
  // Without marking: for the resolver's own bookkeeping and to_ini().
  const boost::program_options::variables_map& unmarked() const { return vm_; }

 private:
  boost::program_options::variables_map vm_;
  std::shared_ptr<std::set<std::string>> read_ = std::make_shared<std::set<std::string>>();
};

class FSDPX_API RunConfig {
 public:
  // Parses `args` (without the program name) and the INI file named by --config, if any. The
  // command line wins over the file. `[wrap] name=size_based` in the file is the same as
  // `--wrap.name size_based`. Throws fsdpx::Error naming the offending option and what would
  // be right: an unknown option (with the closest name), an ill-typed value (with the expected
  // type), an unknown component (with the installed ones), a missing or malformed file.
  static RunConfig resolve(const PluginHost& host, const std::vector<std::string>& args,
                           const ConfigRequest& request);

  // The chosen component of each kind that has one.
  const std::map<Kind, ComponentChoice>& components() const { return components_; }
  const ComponentChoice* choice(Kind kind) const;
  // Whether the run was told to go without a component of `kind` (name none).
  bool switched_off(Kind kind) const { return switched_off_.count(kind) > 0; }
  // The host's own options, parsed and notified; reading one marks it read.
  const HostValues& host_values() const { return host_values_; }
  const std::optional<std::filesystem::path>& config_file() const { return config_file_; }

  // Every key the user gave (command line and --config file) and where, as a message names it:
  // "command line --steps", "config file FILE:LINE: steps" (a key both give: the command line's,
  // which wins), in the order given.
  const std::vector<std::pair<std::string, std::string>>& given() const { return given_; }
  // The first given key that nothing read (a component option its component never read through
  // Options::get_*, a host option never read through host_values()), as a refusal naming where it
  // came from and the closest key the run did read; then an FSDPX_* variable of the environment
  // that looks meant for a run (sim's FSDPX_SIM_ prefix, or a misspelt setting) and is none of its
  // settings, naming the closest; "" when there is none. Meaningful once the host, the plan and
  // every component have read what they use.
  std::string unread() const;
  // Throws fsdpx::Error with unread() when it is not "". The plan calls it last (plan_run).
  void refuse_unread() const;

  // The resolved configuration as an INI file that reproduces it: the plugin folders and files
  // the host options name (plugin-dir, plugin: absolute paths, when the host has such options),
  // then every chosen component with every option, defaults included, in kind order.
  std::string to_ini() const;
  // As to_ini(), but of each created component only the options it read (a run's config.ini:
  // nothing is recorded that the run did not use). A component's name is always recorded.
  std::string used_ini() const;

 private:
  std::map<Kind, ComponentChoice> components_;
  std::set<Kind> switched_off_;
  std::string ini(bool used_only) const;
  HostValues host_values_;
  std::optional<std::filesystem::path> config_file_;
  std::vector<std::pair<std::string, std::string>> given_;
};

// The plugins a command line and its --config file name, added to `search`: --plugin-dir DIR and
// --plugin FILE (repeatable; also top-level keys plugin-dir and plugin of the file) and
// --allow-insecure-plugin-dir (command line only). Read before RunConfig::resolve, which needs the
// plugins loaded. Throws fsdpx::Error for a --config file that cannot be read.
FSDPX_API PluginSearch plugin_search(const std::vector<std::string>& args, PluginSearch search = {});

// The text of an INI file for --config, checked first: a regular file (not a directory, device or
// FIFO) of plausible size holding no NUL byte. Throws fsdpx::Error naming the file and the line.
FSDPX_API std::string read_config_file(const std::filesystem::path& file);

// --config FILE and --<section>.name NAME for every kind (with "none" where `request` allows it),
// for a host's --help.
FSDPX_API boost::program_options::options_description component_choice_options(const ConfigRequest& request);

// A component's description and its options as a table (name, type, default, help), with the
// spelling for the command line and an INI file. For `fsdpx-plugins show` and --help.
FSDPX_API std::string describe_component(const ComponentRecord& component);

}  // namespace fsdpx
