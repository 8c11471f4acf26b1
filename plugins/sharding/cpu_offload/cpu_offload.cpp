// cpu_offload: a base strategy (full_shard, shard_grad_op or hybrid_shard) whose sharded
// parameters, gradients and optimizer state live in host memory, with the optimizer step on the
// CPU. With a GPU, the engine copies a unit's shard to the device before its all-gather and the
// reduced gradient shard back. When the compute device is the CPU there is nothing to move, and
// the run is the base strategy's, bit for bit (the trainer says so once).
#include <string>

#include <fsdpx/error.h>
#include <fsdpx/plugin.h>
#include <fsdpx/sharding_strategy.h>

namespace {

class CpuOffload final : public fsdpx::ShardingStrategy {
 public:
  CpuOffload(std::string base, int shard_size) : base_(std::move(base)), shard_size_(shard_size) {}
  fsdpx::ShardingLayout layout(const fsdpx::Topology& t) const override {
    fsdpx::ShardingLayout l = base_ == "hybrid_shard"
                                  ? fsdpx::hybrid_layout(t, shard_size_, /*reshard_after_forward=*/true, "cpu_offload")
                                  : fsdpx::ShardingLayout{t.world_size, 1, base_ != "shard_grad_op", false};
    l.offload_to_cpu = true;
    return l;
  }

 private:
  std::string base_;
  int shard_size_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::ShardingStrategy>(
      "cpu_offload", "a base strategy with sharded parameters, gradients and optimizer state in host memory",
      {fsdpx::choice_option("base", "full_shard", {"full_shard", "shard_grad_op", "hybrid_shard"},
                            "the strategy to offload"),
       fsdpx::int_option("shard_size", 0, {0, 1 << 20},
                         "hybrid_shard only: ranks per shard group; 0: the ranks per node")},
      [](const fsdpx::ComponentContext& ctx) {
        const int64_t s = ctx.options.get_int("shard_size");
        if (s > 0 && ctx.options.get_string("base") != "hybrid_shard")
          throw fsdpx::Error("shard_size applies to base hybrid_shard only; base is " + ctx.options.get_string("base"));
        return std::make_shared<CpuOffload>(ctx.options.get_string("base"), static_cast<int>(s));
      });
}

}  // namespace

FSDPX_PLUGIN("sharding_cpu_offload", "0.1.0", register_components)
