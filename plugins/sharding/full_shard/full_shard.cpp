// full_shard (ZeRO-3): parameters, gradients and optimizer state split over every rank;
// parameters gathered before each unit's forward and again before its backward, freed after
// each. Per step, each rank sends 3 x (n-1)/n of the parameter bytes (all-gather twice,
// reduce-scatter once), less one all-gather of the root, which stays gathered from its forward
// to its backward.
#include <fsdpx/plugin.h>
#include <fsdpx/sharding_strategy.h>

namespace {
class FullShard final : public fsdpx::ShardingStrategy {
 public:
  fsdpx::ShardingLayout layout(const fsdpx::Topology& t) const override {
    return fsdpx::ShardingLayout{t.world_size, 1, /*reshard_after_forward=*/true, /*offload_to_cpu=*/false};
  }
};
void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::ShardingStrategy>("full_shard",
                                 "shard parameters, gradients and optimizer state over all ranks (ZeRO-3)", {},
                                 [](const fsdpx::ComponentContext&) { return std::make_shared<FullShard>(); });
}
}  // namespace

FSDPX_PLUGIN("sharding_full_shard", "0.1.0", register_components)
