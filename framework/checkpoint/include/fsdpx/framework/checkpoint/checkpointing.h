// Checkpoints, the framework's side: a run's checkpoint directory (listing, completeness,
// pruning), the offline tools (inspect, verify, consolidate), initial weights, Hugging Face
// directories. The formats a checkpoint backend writes through are fsdpx/checkpoint_formats.h
// (the SDK), defined here in the checkpoint layer; fsdpx-ckpt reads them too.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/checkpoint_formats.h"
#include "fsdpx/export.h"

namespace fsdpx {

// --- A run's checkpoint directory -------------------------------------------------------

FSDPX_API std::string checkpoint_dir_name(int64_t step);  // "step-00000010"
// Moves back every .old-step-N whose save died before step-N was in place. Renames: one process
// calls it (the trainer's rank 0, before the others list). Throws fsdpx::Error naming a
// directory that cannot be moved.
FSDPX_API void recover_interrupted_saves(const std::string& root);
// Why the checkpoint directory `dir` is not complete, or "" when it is: every file its format
// needs is present and parses. Sharded: index.json, each rank file it lists (at the size it
// records), trainer_state.json (check_trainer_state) and config.ini. Consolidated:
// model.safetensors (its header), digests.json, and its trainer state when it records one.
// Reads headers and small files only.
FSDPX_API std::string checkpoint_problem(const std::string& dir);
// Why `text`, a checkpoint's trainer state, cannot resume a run, or "": a JSON object with the
// "step" (`step` when given), the "seed" and the data position "data" (an object); "loss_scaler"
// and "hf_config", when there, objects of their form.
FSDPX_API std::string trainer_state_problem(const std::string& text, std::optional<int64_t> step);
// Complete checkpoints under `root` (checkpoint_problem finds nothing), oldest first. Read-only:
// every rank may call it at once.
FSDPX_API std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root);
// The step-N directories under `root` newer than its newest complete checkpoint, newest first,
// each as "DIR: why it is not complete", for --resume auto to name what it skips.
FSDPX_API std::vector<std::string> skipped_checkpoints(const std::string& root);
// Removes all but the newest `keep` complete checkpoints, and stale temporary directories. One
// process calls it. Throws fsdpx::Error naming a directory that cannot be removed.
FSDPX_API void prune_checkpoints(const std::string& root, int64_t keep);

// Fault injection for the interrupted-save test (fsdpx/framework/base/fault_injection.h):
// FSDPX_FAULT=save-after-write:R makes rank R exit abruptly after writing its file, before the
// save completes; save-during-write:R with its file half written.
FSDPX_API void maybe_fault(const char* point, int rank);

// --- Offline (one process, no process group) --------------------------------------------------

struct CheckpointTensorInfo {
  std::string name, dtype, digest;
  std::vector<int64_t> shape;
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> pieces;  // file, (row_offset, rows)
};
struct CheckpointInfo {
  std::string format;  // "fsdpx-sharded", "dcp-safetensors" (a folder PyTorch's DCP wrote) or "safetensors"
  int64_t step = 0;
  int world_size = 0;
  std::vector<CheckpointTensorInfo> tensors;
  std::string trainer_state_json, config_ini;
  int64_t bytes = 0;
};
FSDPX_API CheckpointInfo inspect_checkpoint(const std::string& path);
// Re-reads every byte and checks every digest and size (a folder PyTorch's DCP wrote has no
// digests: its sizes and coverage). Returns the tensors checked; throws fsdpx::Error naming the
// first problem.
FSDPX_API int64_t verify_checkpoint(const std::string& path);
// A consolidated safetensors file from a sharded checkpoint, one tensor at a time.
// `with_optimizer` keeps the optim/ tensors; the model's names are kept as they are.
FSDPX_API void consolidate_checkpoint(const std::string& dir, const std::string& out, bool with_optimizer);

// --- Initial weights -----------------------------------------------------------------------------

// Initial weights (fsdpx-train --init-from): `path` is a safetensors file of whole tensors under
// the model's names, or a directory holding model.safetensors (a consolidated checkpoint, or
// what --save-init wrote). Fills state.tensors (parameters only); each rank reads the byte
// ranges of its own rows and converts to the parameter's dtype. optim/ entries are ignored;
// digests.json beside the file is checked when present. Collective. Throws fsdpx::Error naming
// the file and the missing, extra or misshapen tensor.
FSDPX_API void load_initial_weights(const std::string& path, CheckpointState& state, const CheckpointContext& ctx);

// --- Folders PyTorch's distributed checkpointing wrote ----------------------------------------

// Whether `dir` is a folder PyTorch's DCP wrote as safetensors (HuggingFaceStorageWriter, or
// FileSystemWriter with serialization_format=SAFETENSORS): the sharded format reads it, without
// digests or a trainer state, since DCP records neither.
FSDPX_API bool is_dcp_checkpoint(const std::string& dir);
// For each of `names` (a run's tensors: parameters, and optim/<p>/<key>), the name the DCP folder
// `dir` holds it under: the first of these that the folder holds, else the name itself (the load
// then names it missing):
//   a parameter p: p, "model." + p (dcp.save({"model": ...})), then each of other_names(p);
//   optim/<p>/<key>: itself, then for q among p and other_names(p), DCP's flattened optimizer
//   names (get_optimizer_state_dict with flatten_optimizer_state_dict) "state.<q>.<key>",
//   under no prefix (torchtitan), "optim." or "optimizer.".
// Throws fsdpx::Error as the folder's index (dcp_index) would.
using OtherNames = std::function<std::vector<std::string>(const std::string&)>;
FSDPX_API std::vector<std::string> dcp_names(const std::string& dir, const std::vector<std::string>& names,
                                             const OtherNames& other_names);

// --- Hugging Face directories -------------------------------------------------------------------

// Initial weights from a Hugging Face directory (model.safetensors, or the shards its
// model.safetensors.index.json lists): every parameter of `state` from the tensor hf_name(name),
// each rank reading the byte ranges of its own rows, converted to the parameter's dtype. A tensor
// of the files that no parameter takes is an error unless `ignorable`. Collective. Throws
// fsdpx::Error naming the missing or extra tensor (with the closest name) or both shapes.
FSDPX_API void load_hf_weights(const std::string& dir, CheckpointState& state, const CheckpointContext& ctx,
                               const std::function<std::string(const std::string&)>& hf_name,
                               const std::function<bool(const std::string&)>& ignorable);

struct HfExportOptions {
  std::function<std::string(const std::string&)> hf_name;  // a parameter's Hugging Face name
  std::string config_json;                                 // config.json ("dtype" is set to the files')
  int64_t max_shard_bytes = int64_t{5} << 30;              // larger: model-0000k-of-0000n shards + index
  std::optional<c10::ScalarType> dtype;                    // the checkpoint's when unset
};
struct HfExport {
  std::vector<std::string> files;
  int64_t tensors = 0, bytes = 0;
};
// A sharded or consolidated checkpoint's model tensors as a Hugging Face directory OUT_DIR (new,
// or empty): config.json, model.safetensors or shards with model.safetensors.index.json. One
// tensor in memory at a time; every tensor checked against its digest; written under a
// temporary name and renamed. Offline.
FSDPX_API HfExport export_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& options);

}  // namespace fsdpx
