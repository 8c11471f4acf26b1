// hybrid_shard (HSDP; DeepSpeed's MiCS): shard inside groups of `shard_size` ranks (by default a
// node: the topology's local world size), replicate across the groups. Gradients are
// reduce-scattered in the shard group, then the shard's 1/shard_size of them all-reduced across
// the replicas. reshard_after_forward=false is FSDP1's _HYBRID_SHARD_ZERO2.
#include <string>

#include <fsdpx/error.h>
#include <fsdpx/plugin.h>
#include <fsdpx/sharding_strategy.h>

namespace {

class HybridShard final : public fsdpx::ShardingStrategy {
 public:
  HybridShard(int shard_size, bool reshard) : shard_size_(shard_size), reshard_(reshard) {}
  fsdpx::ShardingLayout layout(const fsdpx::Topology& t) const override {
    return fsdpx::hybrid_layout(t, shard_size_, reshard_, "hybrid_shard");
  }

 private:
  int shard_size_;
  bool reshard_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::ShardingStrategy>(
      "hybrid_shard", "shard within groups of shard_size ranks (default: a node), replicate across groups (HSDP)",
      {fsdpx::int_option("shard_size", 0, {0, 1 << 20},
                         "ranks per shard group; 0: the ranks per node (local world size)"),
       fsdpx::flag_option("reshard_after_forward", true,
                          "free gathered parameters after forward (false: ZeRO-2 flavour)")},
      [](const fsdpx::ComponentContext& ctx) {
        const int64_t s = ctx.options.get_int("shard_size");  // within its declared range
        return std::make_shared<HybridShard>(static_cast<int>(s), ctx.options.get_bool("reshard_after_forward"));
      });
}

}  // namespace

FSDPX_PLUGIN("sharding_hybrid_shard", "0.1.0", register_components)
