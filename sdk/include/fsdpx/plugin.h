// fsdpx/plugin.h: everything a plugin includes to declare itself.
//
// A complete plugin, ready to copy (this one provides a wrap policy; any interface of
// fsdpx/interfaces.h works the same way):
//
//   #include <fsdpx/plugin.h>
//   #include <fsdpx/wrap_policy.h>
//
//   namespace {
//   class EveryChild final : public fsdpx::WrapPolicy {
//    public:
//     std::vector<fsdpx::UnitSelection> select(const torch::nn::Module& root) const override {
//       std::vector<fsdpx::UnitSelection> units;
//       for (const auto& child : root.named_children()) units.push_back({child.key()});
//       return units;
//     }
//   };
//
//   void register_components(fsdpx::Registrar& r) {
//     r.add<fsdpx::WrapPolicy>("every_child", "each direct child of the root is a unit", {},
//                              [](const fsdpx::ComponentContext&) {
//                                return std::make_shared<EveryChild>();
//                              });
//   }
//   }  // namespace
//
//   FSDPX_PLUGIN("my_wrap_every_child", "1.0.0", register_components)
//
// Build it with fsdpx_add_plugin(my_wrap_every_child SOURCES every_child.cpp) from fsdpx's
// CMake package, then: fsdpx-plugins --plugin path/to/my_wrap_every_child.so show every_child
#pragma once

#include <torch/version.h>

#include "fsdpx/abi.h"
#include "fsdpx/registrar.h"
#include "fsdpx/version.h"

#ifndef _GLIBCXX_USE_CXX11_ABI
#define FSDPX_CXX11_ABI_FLAG 0
#else
#define FSDPX_CXX11_ABI_FLAG _GLIBCXX_USE_CXX11_ABI
#endif

// Declares this shared library an fsdpx plugin: defines the one exported entry symbol. NAME and
// VERSION are string literals; REGISTER is a function void(fsdpx::Registrar&). Use once per
// plugin library.
#define FSDPX_PLUGIN(NAME, VERSION, REGISTER)                                                   \
  static void fsdpx_plugin_register_components_(fsdpx_registrar* registrar) {                   \
    REGISTER(*reinterpret_cast<::fsdpx::Registrar*>(registrar));                                \
  }                                                                                             \
  extern "C" __attribute__((visibility("default"))) const fsdpx_plugin_info* fsdpx_plugin_entry( \
      void) {                                                                                   \
    static const fsdpx_plugin_info info = {                                                     \
        sizeof(fsdpx_plugin_info), FSDPX_ABI_MAJOR, FSDPX_ABI_MINOR, NAME, VERSION,             \
        FSDPX_VERSION,           TORCH_VERSION,   FSDPX_CXX11_ABI_FLAG,                         \
        &fsdpx_plugin_register_components_};                                                    \
    return &info;                                                                               \
  }
