// fsdpx/loss_scaling.h: an optional capability of a precision policy whose compute dtype needs
// loss scaling (fp16: gradients below 6e-8 flush to zero, above 65504 overflow).
//
// A policy offers it by inheriting the mix-in besides its interface:
//
//   class Fp16Mixed final : public fsdpx::PrecisionPolicy, public fsdpx::LossScalingPolicy { ... };
//
// The trainer asks with dynamic_cast and never knows a dtype by name: each step it multiplies
// the loss by scale() before backward; afterwards it divides every rank's gradient shards by it,
// looks for inf/NaN in them, and with one all-reduce of a flag learns whether any rank found
// one. Then every rank skips the optimizer step alike (found) or takes it (not found), and calls
// update(found). The scaler's state() goes into checkpoints and comes back with load_state(), so
// an exact resume covers it.
#pragma once

#include <memory>
#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

class FSDPX_API LossScaler {
 public:
  virtual ~LossScaler();
  virtual double scale() const = 0;
  // After each step: found_inf says whether any rank's gradients held inf or NaN.
  virtual void update(bool found_inf) = 0;
  // A JSON object for checkpoints, and back. load_state throws fsdpx::Error on what it cannot read.
  virtual std::string state() const = 0;
  virtual void load_state(const std::string& json) = 0;
};

class FSDPX_API LossScalingPolicy {
 public:
  virtual ~LossScalingPolicy();
  // A scaler for one run, in its initial state.
  virtual std::unique_ptr<LossScaler> make_scaler() const = 0;
};

}  // namespace fsdpx
