#include "replayed_unit.h"

#include <algorithm>
#include <utility>

#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/framework/engine/unit_buffers.h"
#include "sharded_param.h"  // numel_of
#include "step_order.h"

namespace fsdpx {

bool averages_on_device(const StepMemoryInput& in) {
  return in.layout.shard_group_size == 1 && in.layout.replicate_group_size > 1 && in.offload && !in.deterministic;
}

ReplayedUnit replayed_unit(const UnitMemory& u, bool root, const StepMemoryInput& in) {
  const int64_t S = in.layout.shard_group_size, total = u.shard_numel, W = in.world_size;
  const PrecisionSpec& d = u.dtypes;
  ReplayedUnit b;
  b.name = root ? "the root" : "unit " + u.fqn;
  const int64_t f8 = u.float8_numel;  // float8 all-gather: one byte each, gathered and in flight
  b.gathered = gathered_bytes(total, S, d, f8, in.offload);
  b.gather_out = all_gather_bytes(total, S, d, f8);
  // The shard cast to the compute dtype (and float8), or offloading, copied to the device.
  b.gather_in = S > 1 && (d.compute != d.storage || in.offload || f8 > 0) ? b.gather_out / S : 0;
  for (const auto& p : u.params) b.grad_elements += p.second;
  b.grad_shard = total * element_bytes(d.gradient);
  b.packed = S * total * element_bytes(d.reduce);
  if (in.deterministic) {
    b.exchange = S == W ? 0 : W * total * element_bytes(d.reduce);  // the packed rows picked per world rank
    b.reduce_out = W * total * element_bytes(d.reduce);
  } else if (S > 1) {
    // Gloo's reduce-scatter as an all-to-all receives every other rank's slice, S - 1 of them; on a
    // group of more than two a rank between the first and the last receives into a buffer of all S
    // slices (its own among them), the largest on any rank, which the plan takes.
    const int64_t slices = S > 2 ? S : S - 1;
    b.received = in.staged_reduce ? slices * total * element_bytes(d.reduce) : 0;
    b.reduce_out = d.reduce != d.gradient || in.offload ? total * element_bytes(d.reduce) : 0;
  } else if (averages_on_device(in)) {  // the packing, cast to the gradient dtype when it differs
    b.reduce_out = d.reduce != d.gradient ? total * element_bytes(d.gradient) : 0;
  }
  b.reshard_after_forward = reshards_after_forward(in.layout, root, u.reshard_after_forward, b.gathered > 0);
  const int k = post_forward_group(in.layout, root, u.reshard_after_forward);
  if (keeps_post_forward_part(k, S)) b.post_forward = b.gather_out / k;
  b.recompute = u.recompute;
  b.offload = u.recompute && u.offload_activations;
  return b;
}

int64_t widened_gradient(const UnitMemory& u, const StepMemoryInput& in) {
  if (u.dtypes.gradient == u.dtypes.storage || in.offload) return 0;
  const int64_t S = in.layout.shard_group_size;
  int64_t most = 0;
  for (const auto& p : u.params) most = std::max(most, (p.second + S - 1) / S);
  return most * element_bytes(u.dtypes.storage);
}

std::vector<UnitMemory> units_for_memory(const UnitPlan& plan, int64_t shard_size,
                                         const std::vector<PrecisionSpec>& dtypes) {
  std::vector<UnitMemory> units;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const UnitInfo& info = plan.units[i];
    UnitMemory u;
    u.fqn = info.fqn;
    u.shard_numel = padded_shard_numel(info.shapes, shard_size);
    u.dtypes = dtypes.at(i);
    u.recompute = info.activation_checkpoint;
    for (size_t k = 0; k < info.names.size(); ++k) u.params.emplace_back(info.names[k], numel_of(info.shapes[k]));
    units.push_back(std::move(u));
  }
  return units;
}

}  // namespace fsdpx
