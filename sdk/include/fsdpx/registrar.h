// fsdpx/registrar.h: how a plugin hands its components to the host.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdpx/component.h"
#include "fsdpx/export.h"
#include "fsdpx/options.h"

namespace fsdpx {

enum class LogLevel { Debug, Info, Warning };

// Services the host lends to components (STYLE: hand host services to the plugin instead of
// letting it reach for globals). Lives as long as the host.
class FSDPX_API HostServices {
 public:
  virtual ~HostServices();
  virtual void log(LogLevel level, const std::string& message) const = 0;
};

// What a factory receives: its checked options and the host's services.
struct ComponentContext {
  const Options& options;
  const HostServices& host;
};

// A registered component, type-erased. `factory` returns an object of the interface that `kind`
// names (see component.h), as shared_ptr<void> pointing at that interface.
struct ComponentSpec {
  Kind kind;
  std::string name;  // [a-z0-9_]+, unique within its kind among all loaded plugins
  std::string help;  // one line: what it does
  std::vector<OptionSpec> options;
  std::function<std::shared_ptr<void>(const ComponentContext&)> factory;
};

// Receives a plugin's components. The host's implementation credits every registration to the
// plugin being loaded and refuses, with fsdpx::Error, a malformed or duplicate one.
class FSDPX_API Registrar {
 public:
  virtual ~Registrar();

  // Registers a component implementing `Interface` (fsdpx::WrapPolicy, fsdpx::Optimizer, ...).
  // `factory(const ComponentContext&)` returns std::shared_ptr<T> with T derived from Interface;
  // it may throw fsdpx::Error for option values it refuses (the host prefixes the component's
  // name). The host may call a factory more than once per rank, with the same options: the plan
  // before a run makes instances of its own to check and measure (an optimizer probe steps once
  // on a small tensor; a data source is opened as rank 0 would and read once), and the run then
  // makes the instances it trains with. So a factory must not depend on being called once: no
  // side effects beyond the object it returns.
  template <class Interface, class Factory>
  void add(std::string name, std::string help, std::vector<OptionSpec> options, Factory factory) {
    add_component(ComponentSpec{
        Interface::kKind, std::move(name), std::move(help), std::move(options),
        [f = std::move(factory)](const ComponentContext& ctx) -> std::shared_ptr<void> {
          std::shared_ptr<Interface> object = f(ctx);
          return std::static_pointer_cast<void>(object);
        }});
  }

  virtual void add_component(ComponentSpec spec) = 0;
};

}  // namespace fsdpx
