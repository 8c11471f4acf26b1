#include "fsdpx/framework/plugin_host/plugin_host.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include <torch/version.h>

#include "fsdpx/error.h"
#include "fsdpx/files.h"
#include "fsdpx/suggest.h"

namespace fsdpx {
namespace fs = std::filesystem;

namespace {

#ifdef _GLIBCXX_USE_CXX11_ABI
constexpr int kHostCxx11Abi = _GLIBCXX_USE_CXX11_ABI;
#else
constexpr int kHostCxx11Abi = 0;
#endif

// The fields of ABI 1.0, which every ABI-1 plugin has.
constexpr size_t kInfoSizeV1_0 = offsetof(fsdpx_plugin_info, register_components) +
                                 sizeof(fsdpx_plugin_info::register_components);

bool valid_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::islower(c) || std::isdigit(c) || c == '_';
  });
}

std::string str(const char* s) { return s ? std::string(s) : std::string(); }

// Refuses a directory (or file) that other users can write to: writable by everyone, or owned by
// someone who is neither this user nor root. (Group-writable is allowed: Debian's user private
// groups make it the norm.)
void check_not_world_writable(const fs::path& p, const char* what) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return;  // reported by whoever opens it
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    throw Error(std::string("refusing ") + what + " " + p.string() + ": it belongs to another user (uid " +
                std::to_string(st.st_uid) + "), and a plugin is code that runs with your rights; pass "
                "--allow-insecure-plugin-dir to load from it anyway");
  if (st.st_mode & S_IWOTH) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw Error(std::string("refusing ") + what + " " + p.string() +
                ": it is writable by others (mode " + mode +
                "), and a plugin is code that runs with your rights; make it private (chmod o-w " +
                p.string() + ") or pass --allow-insecure-plugin-dir to load from it anyway");
  }
}

// A plugin or component that another file already registered: always an error, also in a
// folder scan (DESIGN.md's plugin contract: refuse duplicates loudly, naming both files).
class DuplicateError : public Error {
 public:
  using Error::Error;
};

fs::path canonical_or_self(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return ec ? p : c;
}

}  // namespace

std::string ComponentRecord::title() const {
  return std::string(kind_title(spec.kind)) + " '" + spec.name + "' (plugin " + plugin->name + ")";
}

void StderrHostServices::log(LogLevel level, const std::string& message) const {
  if (level == LogLevel::Debug) {
    const char* env = std::getenv("FSDPX_LOG");
    if (!env || std::strcmp(env, "debug") != 0) return;
  }
  const char* tag = level == LogLevel::Warning ? "fsdpx: warning: " : "fsdpx: ";
  std::fprintf(stderr, "%s%s\n", tag, message.c_str());
}

// Collects one plugin's registrations; they join the host only if the whole registration
// succeeds (so a plugin that fails half-way leaves nothing behind).
class PluginHost::RegistrarImpl final : public Registrar {
 public:
  RegistrarImpl(const PluginHost& host, std::shared_ptr<const PluginRecord> plugin)
      : host_(host), plugin_(std::move(plugin)) {}

  void add_component(ComponentSpec spec) override {
    auto record = std::make_unique<ComponentRecord>(ComponentRecord{std::move(spec), plugin_});
    const ComponentSpec& s = record->spec;
    const std::string where = plugin_->path.string() + ": plugin '" + plugin_->name + "'";
    if (!valid_name(s.name)) {
      fail(where + " registers a " + kind_title(s.kind) + " named '" + s.name +
           "'; component names use only a-z, 0-9 and _");
    }
    if (!s.factory) fail(where + " registers " + kind_title(s.kind) + " '" + s.name + "' without a factory");
    for (const auto& existing : host_.components_) {
      if (existing->spec.kind == s.kind && existing->spec.name == s.name) {
        duplicate_ = true;
        fail(where + " registers " + kind_title(s.kind) + " '" + s.name +
             "', which plugin '" + existing->plugin->name + "' already registered from " +
             existing->plugin->path.string() + "; remove one of the two plugins");
      }
    }
    std::set<std::string> seen;
    for (const auto& existing : pending_) {
      if (existing->spec.kind == s.kind && existing->spec.name == s.name)
        fail(where + " registers " + kind_title(s.kind) + " '" + s.name + "' twice");
    }
    for (const auto& o : s.options) {
      if (!valid_name(o.name) || o.name == "name")
        fail(where + ": " + kind_title(s.kind) + " '" + s.name + "' declares option '" + o.name +
             "'; option names use only a-z, 0-9 and _, and 'name' is reserved");
      if (!seen.insert(o.name).second)
        fail(where + ": " + kind_title(s.kind) + " '" + s.name + "' declares option '" + o.name + "' twice");
    }
    // Every declared default must itself be a valid value.
    try {
      Options(record->title(), section_name(s.kind), s.options, {});
    } catch (const Error& e) {
      fail(plugin_->path.string() + ": " + e.what());
    }
    pending_.push_back(std::move(record));
  }

  std::vector<std::unique_ptr<const ComponentRecord>> take() { return std::move(pending_); }
  // The message of a refusal raised by add_component, if any (it also propagates as an
  // exception through the plugin's registration function).
  const std::string& refusal() const { return refusal_; }
  // The refusal above is a component that another plugin already registered.
  bool duplicate() const { return duplicate_; }

 private:
  [[noreturn]] void fail(const std::string& message) {
    refusal_ = message;
    throw Error(message);
  }
  const PluginHost& host_;
  std::shared_ptr<const PluginRecord> plugin_;
  std::vector<std::unique_ptr<const ComponentRecord>> pending_;
  std::string refusal_;
  bool duplicate_ = false;
};

PluginHost::PluginHost(std::shared_ptr<const HostServices> services)
    : services_(std::move(services)) {}

PluginHost::~PluginHost() = default;

fs::path PluginHost::default_plugin_dir() { return libfsdpx_directory() / "fsdpx" / "plugins"; }

namespace {

// How a file or folder of a scan that failed is reported: its message, and the way past it.
std::string broken_in_scan(const std::string& what, bool skip_broken) {
  return skip_broken ? what : what + " (remove it, or pass --skip-broken-plugins to go on without it)";
}

}  // namespace

PluginHost::Discovery PluginHost::discover_all(const PluginSearch& search) {
  Discovery found;
  // A folder the user named must be read; one the user did not name (the default one,
  // FSDPX_PLUGIN_PATH's) follows the broken-file rule.
  auto scan = [&](const fs::path& dir, bool named) {
    try {
      if (!search.allow_insecure) check_not_world_writable(dir, "plugin directory");
      scan_directory(dir, search, found);
    } catch (const std::exception& e) {
      if (named) found.errors.push_back(e.what());
      else (search.skip_broken ? found.warnings : found.errors).push_back(broken_in_scan(e.what(), search.skip_broken));
    }
  };
  std::error_code ec;
  if (search.default_dir) {
    fs::path dir = default_plugin_dir();
    if (fs::is_directory(dir, ec)) scan(dir, false);
  }
  if (search.environment) {
    if (const char* env = std::getenv("FSDPX_PLUGIN_PATH")) {
      std::string list = env;
      size_t start = 0;
      while (start <= list.size()) {
        size_t colon = list.find(':', start);
        if (colon == std::string::npos) colon = list.size();
        std::string dir = list.substr(start, colon - start);
        if (!dir.empty()) {
          if (fs::is_directory(dir, ec)) {
            scan(dir, false);
          } else {
            (search.skip_broken ? found.warnings : found.errors)
                .push_back("FSDPX_PLUGIN_PATH names " + dir + ", which is not a directory" +
                           (search.skip_broken ? "" : " (fix FSDPX_PLUGIN_PATH, or pass --skip-broken-plugins)"));
          }
        }
        start = colon + 1;
      }
    }
  }
  for (const auto& dir : search.dirs) scan(dir, true);
  for (const auto& file : search.files) {
    try {
      if (!search.allow_insecure) {
        check_not_world_writable(file, "plugin file");
        check_not_world_writable(canonical_or_self(file).parent_path(), "plugin directory");
      }
      load(file, /*named=*/true);
    } catch (const std::exception& e) {
      found.errors.push_back(e.what());
    }
  }
  return found;
}

std::vector<std::string> PluginHost::discover(const PluginSearch& search) {
  Discovery found = discover_all(search);
  if (found.errors.size() == 1) throw Error(found.errors.front());
  if (found.errors.size() > 1)
    throw Error(found.errors.front() + " (and " + std::to_string(found.errors.size() - 1) +
                " more plugin errors: fsdpx-plugins list shows them all)");
  return found.warnings;
}

std::vector<std::string> PluginHost::load_directory(const fs::path& dir, bool allow_insecure, bool skip_broken) {
  if (!allow_insecure) check_not_world_writable(dir, "plugin directory");
  PluginSearch search;
  search.allow_insecure = allow_insecure;
  search.skip_broken = skip_broken;
  Discovery found;
  scan_directory(dir, search, found);
  if (!found.errors.empty()) throw Error(found.errors.front());
  return found.warnings;
}

void PluginHost::scan_directory(const fs::path& dir, const PluginSearch& search, Discovery& found) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error("plugin directory " + dir.string() + " does not exist or is not a directory");
  std::vector<fs::path> files;
  fs::directory_iterator it(dir, ec), end;
  if (ec) throw Error("plugin directory " + dir.string() + " cannot be read: " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw Error("plugin directory " + dir.string() + " cannot be read: " + ec.message());
    std::error_code dir_ec;
    if (it->path().extension() == ".so" && !it->is_directory(dir_ec)) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    try {
      if (!search.allow_insecure) check_not_world_writable(f, "plugin file");
      load(f, /*named=*/false);
    } catch (const DuplicateError& e) {
      found.errors.push_back(e.what());
    } catch (const std::exception& e) {
      (search.skip_broken ? found.warnings : found.errors).push_back(broken_in_scan(e.what(), search.skip_broken));
    }
  }
}

namespace {

// The plugin's information block, checked against this host: ABI, size, LibTorch, C++ ABI, name.
std::shared_ptr<PluginRecord> plugin_record(const std::string& where, const fsdpx_plugin_info* info) {
  if (!info) throw Error(where + ": " FSDPX_PLUGIN_ENTRY_SYMBOL " returned no plugin information");
  if (info->abi_major != FSDPX_ABI_MAJOR || info->abi_minor > FSDPX_ABI_MINOR) {
    throw Error(where + ": built for fsdpx plugin ABI " + std::to_string(info->abi_major) + "." +
                std::to_string(info->abi_minor) + ", this host speaks " + std::to_string(FSDPX_ABI_MAJOR) + "." +
                std::to_string(FSDPX_ABI_MINOR) + "; rebuild the plugin against this fsdpx SDK");
  }
  if (info->struct_size < kInfoSizeV1_0) {
    throw Error(where + ": its plugin information block is " + std::to_string(info->struct_size) +
                " bytes, smaller than ABI 1.0's " + std::to_string(kInfoSizeV1_0) +
                "; it was not made by FSDPX_PLUGIN");
  }
  auto record = std::make_shared<PluginRecord>();
  record->name = str(info->plugin_name);
  record->version = str(info->plugin_version);
  record->fsdpx_version = str(info->fsdpx_version);
  record->torch_version = str(info->torch_version);
  record->abi_minor = static_cast<int>(info->abi_minor);
  const std::string plugin = where + ": plugin '" + record->name + "'";
  if (record->torch_version != TORCH_VERSION) {
    throw Error(plugin + " was built against LibTorch " + record->torch_version +
                ", but this host runs LibTorch " TORCH_VERSION "; rebuild it against " TORCH_VERSION);
  }
  if (info->cxx11_abi != kHostCxx11Abi) {
    throw Error(plugin + " was built with _GLIBCXX_USE_CXX11_ABI=" + std::to_string(info->cxx11_abi) +
                ", but this host uses _GLIBCXX_USE_CXX11_ABI=" + std::to_string(kHostCxx11Abi) +
                "; rebuild it with LibTorch's compile flags (fsdpx_add_plugin sets them)");
  }
  if (!valid_name(record->name))
    throw Error(where + ": plugin name '" + record->name + "' is invalid; use only a-z, 0-9 and _");
  if (!info->register_components) throw Error(plugin + " has no registration function");
  return record;
}

}  // namespace

void PluginHost::load(const fs::path& file, bool named) {
  const fs::path canonical = canonical_or_self(file);
  if (std::find(loaded_files_.begin(), loaded_files_.end(), canonical) != loaded_files_.end()) return;
  const std::string kind = file_kind(file.string());
  if (kind == "missing") throw Error("plugin file " + file.string() + " does not exist");
  if (kind == "a directory")
    throw Error("plugin file " + file.string() + " is a directory; use --plugin-dir for directories");
  if (!kind.empty()) throw Error("plugin file " + file.string() + " is " + kind + ", not a shared library");

  const std::string where = file.string();
  std::shared_ptr<PluginLibrary> library = PluginLibrary::open(file);
  fsdpx_plugin_entry_fn entry = library->entry();
  if (!entry) {
    if (!named) {
      services_->log(LogLevel::Debug, "skipping " + where + ": no " FSDPX_PLUGIN_ENTRY_SYMBOL " symbol");
      return;
    }
    throw Error(where + " is not an fsdpx plugin: it does not export " FSDPX_PLUGIN_ENTRY_SYMBOL
                " (declare one with FSDPX_PLUGIN from <fsdpx/plugin.h>)");
  }
  const fsdpx_plugin_info* info = entry();
  std::shared_ptr<PluginRecord> record = plugin_record(where, info);
  record->path = file;
  record->library = library;
  for (const auto& p : plugins_) {
    if (p->name == record->name)
      throw DuplicateError(where + ": plugin '" + record->name + "' is already loaded from " + p->path.string() +
                           "; remove one of the two copies");
  }
  register_plugin(record, info);
  plugins_.push_back(record);
  loaded_files_.push_back(canonical);
}

void PluginHost::register_plugin(const std::shared_ptr<const PluginRecord>& record, const fsdpx_plugin_info* info) {
  const std::string plugin = record->path.string() + ": plugin '" + record->name + "'";
  RegistrarImpl registrar(*this, record);
  try {
    info->register_components(reinterpret_cast<fsdpx_registrar*>(static_cast<Registrar*>(&registrar)));
  } catch (const std::exception& e) {
    if (registrar.duplicate()) throw DuplicateError(registrar.refusal());
    if (!registrar.refusal().empty()) throw Error(registrar.refusal());
    throw Error(plugin + " failed while registering its components: " + e.what() +
                "; none of its components were registered");
  } catch (...) {
    throw Error(plugin + " failed while registering its components (a non-standard exception); "
                "none of its components were registered");
  }
  if (registrar.duplicate()) throw DuplicateError(registrar.refusal());  // the plugin caught it
  if (!registrar.refusal().empty()) throw Error(registrar.refusal());
  auto pending = registrar.take();
  if (pending.empty()) services_->log(LogLevel::Warning, plugin + " registered no components");
  for (auto& c : pending) components_.push_back(std::move(c));
  services_->log(LogLevel::Debug, "loaded " + plugin + " " + record->version);
}

std::vector<const ComponentRecord*> PluginHost::components() const {
  std::vector<const ComponentRecord*> out;
  for (const auto& c : components_) out.push_back(c.get());
  std::sort(out.begin(), out.end(), [](const ComponentRecord* a, const ComponentRecord* b) {
    if (a->spec.kind != b->spec.kind) return a->spec.kind < b->spec.kind;
    return a->spec.name < b->spec.name;
  });
  return out;
}

std::vector<const ComponentRecord*> PluginHost::components(Kind kind) const {
  std::vector<const ComponentRecord*> out;
  for (const ComponentRecord* c : components()) {
    if (c->spec.kind == kind) out.push_back(c);
  }
  return out;
}

const ComponentRecord& PluginHost::find(Kind kind, const std::string& name) const {
  std::vector<std::string> names;
  for (const ComponentRecord* c : components(kind)) {
    if (c->spec.name == name) return *c;
    names.push_back(c->spec.name);
  }
  std::string hint;
  if (names.empty()) {
    hint = "; no " + std::string(kind_title(kind)) +
           " plugin is loaded (see `fsdpx-plugins list`, --plugin-dir, FSDPX_PLUGIN_PATH)";
  } else {
    std::string dym = did_you_mean(name, names);
    hint = (dym.empty() ? "." : dym) + " Available: " + join_names(names) + ".";
  }
  throw Error("unknown " + std::string(kind_title(kind)) + " '" + name + "' (" +
              section_name(kind) + ".name)" + hint);
}

Options PluginHost::options_for(Kind kind, const std::string& name,
                                const std::map<std::string, std::string>& given) const {
  const ComponentRecord& c = find(kind, name);
  return Options(c.title(), section_name(kind), c.spec.options, given);
}

namespace {
// Owns a component object and the library its code lives in; the object goes first.
struct KeepAlive {
  std::shared_ptr<PluginLibrary> library;
  std::shared_ptr<const HostServices> services;  // the object may log through it
  std::shared_ptr<void> object;
};
}  // namespace

std::shared_ptr<void> PluginHost::create_erased(Kind kind, const std::string& name,
                                                const Options& options) const {
  const ComponentRecord& c = find(kind, name);
  std::shared_ptr<void> object;
  try {
    object = c.spec.factory(ComponentContext{options, *services_});
  } catch (const Error& e) {
    throw Error(c.title() + ": " + e.what());
  } catch (const std::exception& e) {
    throw Error(c.title() + " could not be created: " + message_of(e));
  }
  if (!object) throw Error(c.title() + ": its factory returned nothing (a bug in the plugin)");
  services_->log(LogLevel::Debug, "created " + c.title());
  auto keep = std::make_shared<KeepAlive>(KeepAlive{c.plugin->library, services_, std::move(object)});
  void* raw = keep->object.get();
  return std::shared_ptr<void>(std::move(keep), raw);
}

}  // namespace fsdpx
