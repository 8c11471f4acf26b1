// FSDPX_MODULE's registry: wrappable layers (weakly held, so a layer that dies is forgotten even
// if its address is reused) and the hooks engines installed.
#include "fsdpx/framework/base/unit_registry.h"

#include <mutex>
#include <unordered_map>

#include "fsdpx/error.h"

namespace fsdpx {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<const torch::nn::Module*, std::weak_ptr<torch::nn::Module>>& wrappable() {
  static std::unordered_map<const torch::nn::Module*, std::weak_ptr<torch::nn::Module>> w;
  return w;
}
std::unordered_map<const torch::nn::Module*, UnitHooks*>& installed() {
  static std::unordered_map<const torch::nn::Module*, UnitHooks*> h;
  return h;
}

}  // namespace

UnitHooks::~UnitHooks() = default;

bool is_wrappable(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = wrappable().find(&module);
  return it != wrappable().end() && it->second.lock().get() == &module;
}

namespace detail {
void mark_wrappable(const std::shared_ptr<torch::nn::Module>& module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  wrappable()[module.get()] = module;
}
UnitHooks* hooks_of(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = installed().find(module);
  return it == installed().end() ? nullptr : it->second;
}
}  // namespace detail

void install_unit_hooks(const std::vector<const torch::nn::Module*>& modules, const std::vector<UnitHooks*>& hooks,
                        const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (size_t i = 0; i < modules.size(); ++i)
    if (installed().count(modules[i]))
      throw Error("unit '" + names[i] + "' is already a unit of another live ShardingEngine; one model, one engine");
  for (size_t i = 0; i < modules.size(); ++i) installed()[modules[i]] = hooks[i];
}

void remove_unit_hooks(const std::vector<const torch::nn::Module*>& modules, const std::vector<UnitHooks*>& hooks) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (size_t i = 0; i < modules.size(); ++i) {
    auto it = installed().find(modules[i]);
    if (it != installed().end() && it->second == hooks[i]) installed().erase(it);
  }
}

}  // namespace fsdpx
