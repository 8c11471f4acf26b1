// fsdpx/capabilities.h: optional capabilities a component declares (plugin ABI 1.1), found by
// the host with dynamic_cast like the evaluation mix-ins. A component without one is taken to
// have the default said here.
#pragma once

#include <string>
#include <vector>

#include "fsdpx/export.h"

namespace fsdpx {

// On an optimizer: where its step can run. Default (not declared): on the CPU too.
class FSDPX_API OptimizerDevices {
 public:
  virtual ~OptimizerDevices();
  // Whether step() can update shards, gradients and state that live in host memory, as
  // cpu_offload needs (a fused CUDA-only kernel cannot).
  virtual bool runs_on_cpu() const = 0;
};

// On a component whose options name units (a precision policy's per-unit patterns): checked once
// the run's units are chosen, so that an option naming no unit is refused instead of doing
// nothing. Default (not declared): nothing to check.
class FSDPX_API UnitNameCheck {
 public:
  virtual ~UnitNameCheck();
  // `units`: every unit's path, "" for the root unit. Throws fsdpx::Error naming the option and a
  // name or pattern that matches none of them, with the units it could match.
  virtual void check_unit_names(const std::vector<std::string>& units) const = 0;
};

// On a precision policy: the units whose linear layers compute in float8 (fsdpx/float8.h), the
// engine turning float8 on around their forward and recompute. Default (not declared): none.
class FSDPX_API Float8Units {
 public:
  virtual ~Float8Units();
  // `unit`: its path, "" for the root unit.
  virtual bool float8(const std::string& unit) const = 0;
};

// On a precision policy that declares Float8Units: whether the float8 units gather their linear
// weights in float8 (FSDP2 with torchao's enable_fsdp_float8_all_gather): each weight cast to e4m3
// on its shard before the all-gather, half of bf16's bytes, with one scale per weight computed for
// all units at once before each forward (one all-reduce of the amaxes, as torchao's
// precompute_float8_dynamic_scale_for_fsdp). Default (not declared): gathered in the compute dtype.
class FSDPX_API Float8AllGather {
 public:
  virtual ~Float8AllGather();
  virtual bool float8_all_gather() const = 0;
};

// On a model: the parameters it reads only as the weight of fsdpx::linear (fsdpx/linear.h), which
// float8 all-gather may hold in float8 alone inside a step. A parameter also read otherwise (a
// tied embedding, a norm) must not be listed: its read would fail. Default (not declared): none,
// and float8 all-gather is refused for the model.
class FSDPX_API LinearWeights {
 public:
  virtual ~LinearWeights();
  // `parameter`: its path in the model, as named_parameters() gives it.
  virtual bool linear_weight(const std::string& parameter) const = 0;
};

}  // namespace fsdpx
