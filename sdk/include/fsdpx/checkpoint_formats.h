// fsdpx/checkpoint_formats.h: fsdpx's own checkpoint formats, for a checkpoint backend
// (fsdpx/checkpoint_backend.h) to write and read through. The in-tree `sharded` and
// `consolidated` plugins are these calls and nothing else:
//
//   using namespace fsdpx;
//   class Sharded final : public CheckpointBackend {
//    public:
//     void save(const std::string& dir, const CheckpointState& state, const CheckpointContext& ctx) override {
//       save_sharded(dir, state, ctx);
//     }
//     void load(const std::string& dir, CheckpointState& state, const CheckpointContext& ctx) override {
//       load_sharded(dir, state, ctx);
//     }
//     std::optional<std::string> latest(const std::string& root) const override { return latest_checkpoint(root); }
//   };
//
// Each call is collective (every rank calls it with its own state), refuses what it cannot read
// with fsdpx::Error naming the tensor or file, and makes a save crash-safe: files are written
// under a temporary name, fsynced, and renamed into place only when every rank has written, so an
// interrupted save never looks like a checkpoint. Defined in libfsdpx (its checkpoint layer),
// where fsdpx-ckpt reads the same formats.
//
// Sharded format, a directory step-NNNNNNNN/:
//   index.json             {"format": "fsdpx-sharded", "version": 1, "step", "world_size",
//                           "tensors": {name: {"dtype", "shape", "digest" (row-decomposable XXH3),
//                                             "pieces": [{"file", "row_offset", "rows"}]}},
//                           "files": {file: bytes}}
//   rank-RRRRR.safetensors the rows rank R held, one entry per tensor it wrote
//   trainer_state.json     the trainer's state (step, seed, data position, ...)
//   config.ini             the resolved configuration the run was started with
// Written under .tmp-step-NNNNNNNN/ and renamed when every rank has finished; an older step-N it
// replaces is moved to .old-step-N first and removed last.
//
// Consolidated format: one safetensors file DIR/model.safetensors of whole tensors under their
// own names (Python's safetensors reads it), with digests.json beside it.
#pragma once

#include <optional>
#include <string>

#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/export.h"

namespace fsdpx {

// Every rank writes its rows of `state` (the first replica alone, under hybrid sharding) into
// DIR/rank-RRRRR.safetensors; rank 0 writes the index, trainer_state.json and config.ini.
FSDPX_API void save_sharded(const std::string& dir, const CheckpointState& state, const CheckpointContext& ctx);
// The same save in its parts (StreamedCheckpointBackend::begin_save): rank 0 makes the temporary
// directory (collective over `ctx`); the writer takes this rank's rows a buffer at a time into
// DIR/.tmp-NAME/rank-RRRRR.safetensors, and its finish() agrees and renames. save_sharded is
// begin_sharded_save, every owned tensor written whole, and finish over the same `ctx`.
FSDPX_API std::unique_ptr<CheckpointWriter> begin_sharded_save(const std::string& dir, const CheckpointState& layout,
                                                               const CheckpointContext& ctx);
// Fills state.tensors (any layout: each rank reads the byte ranges overlapping its rows),
// state.step, trainer_state_json and config_ini; then every rank checks the digests of the
// tensors assembled over all ranks.
FSDPX_API void load_sharded(const std::string& dir, CheckpointState& state, const CheckpointContext& ctx);

// One safetensors file DIR/model.safetensors of whole tensors, written by rank 0 from tensors
// gathered one at a time (CheckpointContext::gather_to_rank0); __metadata__ holds the step,
// trainer state and configuration. `with_optimizer`: also the optimizer state (optim/...).
FSDPX_API void save_consolidated(const std::string& dir, const CheckpointState& state, const CheckpointContext& ctx,
                                 bool with_optimizer);
// Fills state as load_sharded does, each rank reading its rows of the whole tensors.
FSDPX_API void load_consolidated(const std::string& dir, CheckpointState& state, const CheckpointContext& ctx);

// The newest complete checkpoint of either format under `root` (a step-N directory with every
// file its format needs present and parsing), if any. Read-only: every rank may call it at once.
FSDPX_API std::optional<std::string> latest_checkpoint(const std::string& root);

}  // namespace fsdpx
