// PluginHost: finds, checks and loads plugins, and creates their components.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdpx/export.h"
#include "fsdpx/framework/plugin_host/plugin_library.h"
#include "fsdpx/registrar.h"

namespace fsdpx {

// A loaded plugin, as its info block describes it.
struct FSDPX_API PluginRecord {
  std::string name;
  std::string version;
  std::string fsdpx_version;
  std::string torch_version;
  int abi_minor = 0;  // FSDPX_ABI_MINOR it was built with: what of the interfaces it knows (abi.h)
  std::filesystem::path path;
  std::shared_ptr<PluginLibrary> library;
};

// A registered component and the plugin it came from.
struct FSDPX_API ComponentRecord {
  ComponentSpec spec;
  std::shared_ptr<const PluginRecord> plugin;

  // "wrap policy 'size_based' (plugin wrap_size_based)", for messages.
  std::string title() const;
};

// Where to look for plugins. Searched in this order; a file found twice is loaded once.
struct PluginSearch {
  bool default_dir = true;  // <prefix>/lib/fsdpx/plugins, next to libfsdpx
  bool environment = true;  // FSDPX_PLUGIN_PATH, ':'-separated directories
  std::vector<std::filesystem::path> dirs;   // --plugin-dir
  std::vector<std::filesystem::path> files;  // --plugin
  // Load from directories that others can write to (--allow-insecure-plugin-dir).
  bool allow_insecure = false;
  // A file of a scanned folder that fails to load, or a folder of FSDPX_PLUGIN_PATH or the default
  // one that cannot be read, only warns (--skip-broken-plugins); without it each is an error.
  bool skip_broken = false;
};

// Logs Info and Warning to stderr as "fsdpx: ...", and Debug too when FSDPX_LOG=debug.
class FSDPX_API StderrHostServices : public HostServices {
 public:
  void log(LogLevel level, const std::string& message) const override;
};

class FSDPX_API PluginHost {
 public:
  explicit PluginHost(std::shared_ptr<const HostServices> services =
                          std::make_shared<StderrHostServices>());
  ~PluginHost();
  PluginHost(const PluginHost&) = delete;
  PluginHost& operator=(const PluginHost&) = delete;

  // <prefix>/lib/fsdpx/plugins for the libfsdpx in use.
  static std::filesystem::path default_plugin_dir();

  // What loading found wrong, one message per failure, each naming the file. The rule, the same
  // for every host: a plugin file that cannot be loaded is an error, whether the user named it
  // (--plugin) or a folder scan found it (--plugin-dir, FSDPX_PLUGIN_PATH, the default folder),
  // and so is a folder that cannot be read and a plugin or component registered twice (both files
  // named). With PluginSearch::skip_broken, a broken file or unreadable folder of a scan is a
  // warning instead; a named file, a named folder and a duplicate stay errors. A library without
  // the entry symbol is not an fsdpx plugin: a scan passes over it quietly.
  struct Discovery {
    std::vector<std::string> errors, warnings;
  };
  // Loads every plugin that `search` names. A failure of one plugin does not stop the others.
  Discovery discover_all(const PluginSearch& search);
  // The same, for a run: throws fsdpx::Error with the first error (and how many more there are);
  // returns the warnings, for the host to print.
  std::vector<std::string> discover(const PluginSearch& search);

  // Loads every *.so in `dir`. Libraries without the entry symbol are skipped quietly. Throws
  // fsdpx::Error if `dir` is missing or writable by others (unless allowed), when a plugin or
  // component of it is already registered, or when a file fails to load; with `skip_broken`,
  // returns those per-file failures instead.
  std::vector<std::string> load_directory(const std::filesystem::path& dir, bool allow_insecure,
                                          bool skip_broken = false);

  // Loads one plugin file the user named. Throws fsdpx::Error on any failure, including a
  // library without the entry symbol. Loading a file already loaded does nothing.
  void load_file(const std::filesystem::path& file) { load(file, /*named=*/true); }

  const std::vector<std::shared_ptr<const PluginRecord>>& plugins() const { return plugins_; }
  // All components, sorted by kind, then name.
  std::vector<const ComponentRecord*> components() const;
  std::vector<const ComponentRecord*> components(Kind kind) const;

  // The component `name` of `kind`. Throws fsdpx::Error listing what exists and suggesting the
  // closest name if there is none.
  const ComponentRecord& find(Kind kind, const std::string& name) const;

  // Checks `given` (option -> text) against the component's declared options.
  Options options_for(Kind kind, const std::string& name,
                      const std::map<std::string, std::string>& given) const;

  // Creates component `name` of Interface's kind with checked options. The object keeps its
  // plugin library alive. Errors from the factory are rethrown as fsdpx::Error naming the
  // component.
  template <class Interface>
  std::shared_ptr<Interface> create(const std::string& name, const Options& options) const {
    return std::static_pointer_cast<Interface>(create_erased(Interface::kKind, name, options));
  }
  template <class Interface>
  std::shared_ptr<Interface> create(const std::string& name,
                                    const std::map<std::string, std::string>& given = {}) const {
    return create<Interface>(name, options_for(Interface::kKind, name, given));
  }

  const HostServices& services() const { return *services_; }

 private:
  class RegistrarImpl;
  void load(const std::filesystem::path& file, bool named);
  // Loads `dir`'s plugins: a file that fails goes to `found.errors`, or to `found.warnings` under
  // search.skip_broken; a duplicate is always an error.
  void scan_directory(const std::filesystem::path& dir, const PluginSearch& search, Discovery& found);
  // Runs the plugin's registration; its components join only if all of it succeeds.
  void register_plugin(const std::shared_ptr<const PluginRecord>& record, const fsdpx_plugin_info* info);
  std::shared_ptr<void> create_erased(Kind kind, const std::string& name,
                                      const Options& options) const;

  std::shared_ptr<const HostServices> services_;
  std::vector<std::shared_ptr<const PluginRecord>> plugins_;
  std::vector<std::unique_ptr<const ComponentRecord>> components_;
  std::vector<std::filesystem::path> loaded_files_;  // canonical paths, including non-plugins
};

}  // namespace fsdpx
