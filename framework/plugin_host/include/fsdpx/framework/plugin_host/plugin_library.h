// One loaded plugin library. The only place fsdpx touches the dynamic loader (Boost.DLL).
#pragma once

#include <filesystem>
#include <memory>

#include "fsdpx/abi.h"
#include "fsdpx/export.h"

namespace fsdpx {

class FSDPX_API PluginLibrary {
 public:
  // Loads `file` with immediate binding and local symbols. Throws fsdpx::Error naming the file
  // and carrying the dynamic loader's own message if it is not a loadable library.
  static std::shared_ptr<PluginLibrary> open(const std::filesystem::path& file);

  // The plugin entry function, or nullptr if the library does not export one (not a plugin).
  fsdpx_plugin_entry_fn entry() const;
  const std::filesystem::path& path() const { return path_; }

  // The library is never unloaded while the process runs (LibTorch's static registrations make
  // unloading unsafe); destroying this object keeps it mapped.
  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

 private:
  struct Impl;
  explicit PluginLibrary(std::filesystem::path path, std::unique_ptr<Impl> impl);
  std::filesystem::path path_;
  std::unique_ptr<Impl> impl_;
};

// The directory libfsdpx itself was loaded from (<prefix>/lib), found through the loader.
FSDPX_API std::filesystem::path libfsdpx_directory();

}  // namespace fsdpx
