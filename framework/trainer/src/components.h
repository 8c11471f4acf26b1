// A run's components, created from its configuration.
#pragma once

#include <memory>
#include <string>

#include "fsdpx/error.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/interfaces.h"

namespace fsdpx {

// The configuration's choice for `kind`; throws fsdpx::Error asking for --<section>.name.
const ComponentChoice& chosen(const RunConfig& config, Kind kind);

// The chosen component of T's kind, created with its options; errors name the component once
// (PluginHost::create does: "optimizer 'adamw' (plugin optimizer_adamw): ...").
template <class T>
std::shared_ptr<T> make(const PluginHost& host, const RunConfig& config) {
  const ComponentChoice& c = chosen(config, T::kKind);
  return host.create<T>(c.name, c.options);
}

// Whether `opt` can step on the CPU (fsdpx/capabilities.h; yes unless it says otherwise).
bool runs_on_cpu(const Optimizer& opt);

}  // namespace fsdpx
