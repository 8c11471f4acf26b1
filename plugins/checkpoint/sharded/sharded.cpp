// sharded: every rank writes its own rows to a safetensors file; an index with each tensor's
// shape, dtype, pieces and digest makes the checkpoint loadable at any world size and strategy.
// The format and its checks live in libfsdpx (fsdpx/checkpoint_formats.h), shared with fsdpx-ckpt.
// Saves stage through a bounded pool of host memory (pool_mib) and, with async, are written by a
// thread of their own while training goes on (fsdpx/checkpoint_backend.h, StreamedCheckpointBackend).
#include <fsdpx/checkpoint_backend.h>
#include <fsdpx/checkpoint_formats.h>
#include <fsdpx/plugin.h>

namespace {

class Sharded final : public fsdpx::CheckpointBackend, public fsdpx::StreamedCheckpointBackend {
 public:
  Sharded(bool async, int64_t pool_bytes) : async_(async), pool_bytes_(pool_bytes) {}
  void save(const std::string& dir, const fsdpx::CheckpointState& state, const fsdpx::CheckpointContext& ctx) override {
    fsdpx::save_sharded(dir, state, ctx);
  }
  void load(const std::string& dir, fsdpx::CheckpointState& state, const fsdpx::CheckpointContext& ctx) override {
    fsdpx::load_sharded(dir, state, ctx);
  }
  std::optional<std::string> latest(const std::string& root) const override { return fsdpx::latest_checkpoint(root); }

  bool saves_in_background() const override { return async_; }
  int64_t staging_bytes() const override { return pool_bytes_; }
  std::unique_ptr<fsdpx::CheckpointWriter> begin_save(const std::string& dir, const fsdpx::CheckpointState& layout,
                                                      const fsdpx::CheckpointContext& ctx) override {
    return fsdpx::begin_sharded_save(dir, layout, ctx);
  }

 private:
  const bool async_;
  const int64_t pool_bytes_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::CheckpointBackend>(
      "sharded", "each rank writes its shards (safetensors) and an index; reshardable at load, digests checked",
      {fsdpx::flag_option("async", false,
                          "write saves in the background: the step waits only while the state is staged into the "
                          "pool; a writer thread per rank writes and fsyncs, and the checkpoint is complete when "
                          "every rank's writer has finished"),
       fsdpx::int_option("pool_mib", 2048, {1, 1 << 20},
                         "host memory a save stages through, per rank (MiB; pinned on a device): a save never holds "
                         "more; a rank's state beyond it waits for the writer to free a buffer")},
      [](const fsdpx::ComponentContext& ctx) {
        return std::make_shared<Sharded>(ctx.options.get_bool("async"), ctx.options.get_int("pool_mib") << 20);
      });
}

}  // namespace

FSDPX_PLUGIN("checkpoint_sharded", "0.1.0", register_components)
