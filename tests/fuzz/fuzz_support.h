// Shared by the fuzz targets (libFuzzer): inputs as files, the installed plugins, and the rule
// every target checks: bad input may only end in fsdpx::Error (a clear message). Any other
// exception, a crash or a sanitizer report is a finding.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/program_options.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"

namespace fsdpx::fuzz {

// A directory of this process's own under /dev/shm (or /tmp), removed at exit.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    std::filesystem::path d = base / ("fsdpx-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] { std::filesystem::remove_all(scratch()); });
    return d;
  }();
  return dir;
}

inline std::filesystem::path write(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path p = scratch() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return p;
}

// The plugins of this build (next to libfsdpx), loaded once.
inline PluginHost& plugins() {
  static std::unique_ptr<PluginHost> host = [] {
    auto h = std::make_unique<PluginHost>();
    PluginSearch search;
    search.environment = false;
    for (const auto& e : h->discover(search)) std::fprintf(stderr, "%s\n", e.c_str());
    return h;
  }();
  return *host;
}

// Runs `f`; fsdpx::Error is the expected answer to bad input, anything else aborts (a finding).
inline void expect_clear_errors(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error&) {
  } catch (const boost::program_options::error& e) {  // its what() can loop forever (program_options.h)
    std::fprintf(stderr, "not an fsdpx::Error: %s\n", option_error_text(e).c_str());
    std::abort();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "not an fsdpx::Error: %s\n", e.what());
    std::abort();
  }
}

}  // namespace fsdpx::fuzz
