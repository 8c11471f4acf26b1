// no_shard (DDP): every rank holds everything; gradients are all-reduced (2 x (n-1)/n of the
// parameter bytes per step).
#include <fsdpx/plugin.h>
#include <fsdpx/sharding_strategy.h>

namespace {
class NoShard final : public fsdpx::ShardingStrategy {
 public:
  fsdpx::ShardingLayout layout(const fsdpx::Topology& t) const override {
    return fsdpx::ShardingLayout{1, t.world_size, /*reshard_after_forward=*/false, /*offload_to_cpu=*/false};
  }
};
void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::ShardingStrategy>("no_shard", "replicate everything and all-reduce gradients (DDP)",
                                 {}, [](const fsdpx::ComponentContext&) { return std::make_shared<NoShard>(); });
}
}  // namespace

FSDPX_PLUGIN("sharding_no_shard", "0.1.0", register_components)
