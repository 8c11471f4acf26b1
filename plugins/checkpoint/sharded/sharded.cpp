// sharded: every rank writes its own rows to a safetensors file; an index with each tensor's
// shape, dtype, pieces and digest makes the checkpoint loadable at any world size and strategy.
// The format and its checks live in libfsdpx (fsdpx/checkpoint_formats.h), shared with fsdpx-ckpt.
#include <fsdpx/checkpoint_backend.h>
#include <fsdpx/checkpoint_formats.h>
#include <fsdpx/plugin.h>

namespace {

class Sharded final : public fsdpx::CheckpointBackend {
 public:
  void save(const std::string& dir, const fsdpx::CheckpointState& state, const fsdpx::CheckpointContext& ctx) override {
    fsdpx::save_sharded(dir, state, ctx);
  }
  void load(const std::string& dir, fsdpx::CheckpointState& state, const fsdpx::CheckpointContext& ctx) override {
    fsdpx::load_sharded(dir, state, ctx);
  }
  std::optional<std::string> latest(const std::string& root) const override { return fsdpx::latest_checkpoint(root); }
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::CheckpointBackend>(
      "sharded", "each rank writes its shards (safetensors) and an index; reshardable at load, digests checked", {},
      [](const fsdpx::ComponentContext&) { return std::make_shared<Sharded>(); });
}

}  // namespace

FSDPX_PLUGIN("checkpoint_sharded", "0.1.0", register_components)
