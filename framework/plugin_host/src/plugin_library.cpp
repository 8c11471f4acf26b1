#include "fsdpx/framework/plugin_host/plugin_library.h"

#include <dlfcn.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "fsdpx/error.h"

namespace fsdpx {

struct PluginLibrary::Impl {
  boost::dll::shared_library library;
};

namespace {

// Boost.DLL appends "(dlerror system message: <text>)"; the loader's text is what the user
// needs ("file too short", "cannot open shared object file: No such file or directory").
std::string loader_message(const std::string& what) {
  const std::string marker = "dlerror system message: ";
  auto at = what.find(marker);
  if (at == std::string::npos) return what;
  std::string text = what.substr(at + marker.size());
  auto end = text.rfind(')');
  return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace

std::shared_ptr<PluginLibrary> PluginLibrary::open(const std::filesystem::path& file) {
  auto impl = std::make_unique<Impl>();
  try {
    impl->library.load(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    const std::string msg = loader_message(e.what());
    const bool undefined = msg.find("undefined symbol") != std::string::npos;
    throw Error("cannot load plugin " + file.string() + ": " +
                (undefined ? "it needs a symbol this process lacks (" + msg +
                                 "); it was probably built against another fsdpx or LibTorch"
                           : "not a loadable library: " + msg));
  }
  // Pin the library for the life of the process: the loader then never unmaps it, whatever
  // happens to the handles (this call only adds the flag; the library is already loaded).
  if (!dlopen(impl->library.location().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD | RTLD_NODELETE))
    throw Error("cannot pin plugin " + file.string() + " in memory: " + loader_message(dlerror()));
  return std::shared_ptr<PluginLibrary>(new PluginLibrary(file, std::move(impl)));
}

PluginLibrary::PluginLibrary(std::filesystem::path path, std::unique_ptr<Impl> impl)
    : path_(std::move(path)), impl_(std::move(impl)) {}

// Boost.DLL closes its handle here; the RTLD_NODELETE pin taken in open() keeps the code mapped.
PluginLibrary::~PluginLibrary() = default;

fsdpx_plugin_entry_fn PluginLibrary::entry() const {
  if (!impl_->library.has(FSDPX_PLUGIN_ENTRY_SYMBOL)) return nullptr;
  return impl_->library.get<const fsdpx_plugin_info*()>(FSDPX_PLUGIN_ENTRY_SYMBOL);
}

std::filesystem::path libfsdpx_directory() {
  return boost::dll::this_line_location().lexically_normal().parent_path();
}

}  // namespace fsdpx
