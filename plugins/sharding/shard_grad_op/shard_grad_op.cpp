// shard_grad_op (ZeRO-2): like full_shard, but a unit's gathered parameters stay from its
// forward to its backward: one all-gather and one reduce-scatter per step (2 x (n-1)/n of the
// parameter bytes), at the memory cost of unsharded parameters during the step.
#include <fsdpx/plugin.h>
#include <fsdpx/sharding_strategy.h>

namespace {
class ShardGradOp final : public fsdpx::ShardingStrategy {
 public:
  fsdpx::ShardingLayout layout(const fsdpx::Topology& t) const override {
    return fsdpx::ShardingLayout{t.world_size, 1, /*reshard_after_forward=*/false, /*offload_to_cpu=*/false};
  }
};
void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::ShardingStrategy>(
      "shard_grad_op", "shard gradients and optimizer state; keep parameters gathered through the step (ZeRO-2)", {},
      [](const fsdpx::ComponentContext&) { return std::make_shared<ShardGradOp>(); });
}
}  // namespace

FSDPX_PLUGIN("sharding_shard_grad_op", "0.1.0", register_components)
