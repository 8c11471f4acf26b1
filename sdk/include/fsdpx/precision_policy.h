// fsdpx/precision_policy.h: the dtypes of storage, compute, communication and reduction.
#pragma once

#include <optional>

#include <c10/core/ScalarType.h>

#include "fsdpx/component.h"
#include "fsdpx/export.h"

namespace fsdpx {

struct PrecisionSpec {
  c10::ScalarType storage = c10::kFloat;     // the sharded parameters the optimizer updates
  c10::ScalarType compute = c10::kFloat;     // parameters in forward/backward; also the all-gather dtype
  c10::ScalarType reduce = c10::kFloat;      // gradients on the wire (reduce-scatter, all-reduce)
  c10::ScalarType gradient = c10::kFloat;    // the sharded .grad handed to the optimizer
  std::optional<c10::ScalarType> buffer;     // module buffers; unset = leave as built
  std::optional<c10::ScalarType> output;     // cast the model's (root unit's) floating output; unset = leave
  bool cast_forward_inputs = false;          // cast floating inputs of each unit to `compute`
  bool loss_scaling = false;                 // scale the loss and unscale gradients (fp16)
};

class FSDPX_API PrecisionPolicy {
 public:
  static constexpr Kind kKind = Kind::Precision;
  virtual ~PrecisionPolicy();

  // The dtypes for the parameters of the unit `unit_fqn` ("" is the root unit).
  virtual PrecisionSpec spec(const std::string& unit_fqn) const = 0;
};

}  // namespace fsdpx
