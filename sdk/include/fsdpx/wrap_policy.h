// fsdpx/wrap_policy.h: which submodules become sharding units.
#pragma once

#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "fsdpx/component.h"
#include "fsdpx/export.h"

namespace fsdpx {

// One submodule chosen as a unit: its parameters (those not in a nested unit) are gathered with
// one all-gather and their gradients reduced with one reduce-scatter.
struct UnitSelection {
  std::string fqn;                     // dotted path as in named_modules(), e.g. "blocks.3"
  bool activation_checkpoint = false;  // recompute this unit's activations in backward
};

// A module's layer type, as layer_type and --activation-checkpointing name it: its module name
// (torch::nn::Module("Block")) or its C++ type name, without namespaces and a trailing "Impl".
FSDPX_API std::string layer_type_name(const torch::nn::Module& module);

class FSDPX_API WrapPolicy {
 public:
  static constexpr Kind kKind = Kind::Wrap;
  virtual ~WrapPolicy();

  // Chooses the units of the model `root`. Returns the submodules that become units, each once,
  // in any order; the root is always a unit and is not listed. Must depend only on the module
  // tree (names, class names, parameter shapes), never on the rank, so that every rank plans
  // the same units. Throws fsdpx::Error if the model offers nothing the policy can work with.
  // The host passes select()'s errors on as they are (only a factory's get the component's name
  // put in front), so start the message with the policy's name, as the in-tree ones do:
  // "layer_type selected no unit: no submodule is a Block; ...".
  virtual std::vector<UnitSelection> select(const torch::nn::Module& root) const = 0;
};

}  // namespace fsdpx
