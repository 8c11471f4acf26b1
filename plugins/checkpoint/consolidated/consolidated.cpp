// consolidated: one safetensors file of whole tensors under the model's own parameter names,
// written by rank 0 from tensors gathered one at a time (peak memory: the largest tensor, not the
// model). Python's safetensors reads it as it is.
#include <fsdpx/checkpoint_backend.h>
#include <fsdpx/checkpoint_formats.h>
#include <fsdpx/plugin.h>

namespace {

class Consolidated final : public fsdpx::CheckpointBackend {
 public:
  explicit Consolidated(bool optimizer) : optimizer_(optimizer) {}
  void save(const std::string& dir, const fsdpx::CheckpointState& state, const fsdpx::CheckpointContext& ctx) override {
    fsdpx::save_consolidated(dir, state, ctx, optimizer_);
  }
  void load(const std::string& dir, fsdpx::CheckpointState& state, const fsdpx::CheckpointContext& ctx) override {
    fsdpx::load_consolidated(dir, state, ctx);
  }
  std::optional<std::string> latest(const std::string& root) const override { return fsdpx::latest_checkpoint(root); }

 private:
  bool optimizer_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::CheckpointBackend>(
      "consolidated", "one safetensors file of whole tensors (model.safetensors), written by rank 0 tensor by tensor",
      {fsdpx::flag_option("optimizer", true,
                          "also store the optimizer state (as optim/<param>/<key>), so the file can resume training")},
      [](const fsdpx::ComponentContext& ctx) {
        return std::make_shared<Consolidated>(ctx.options.get_bool("optimizer"));
      });
}

}  // namespace

FSDPX_PLUGIN("checkpoint_consolidated", "0.1.0", register_components)
