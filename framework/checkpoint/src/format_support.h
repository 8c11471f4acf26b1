// What the checkpoint formats share: row geometry, file and JSON reading, the cross-rank
// agreement of a save or load, the sharded index and reading rows from its pieces.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/framework/base/dtype_name.h"  // shape_text
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/framework/checkpoint/safetensors.h"

namespace fsdpx::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kOptimPrefix = "optim/";

// Rows (rows_of) and elements per row: fsdpx/framework/base/shard_geometry.h.
int64_t row_bytes_of(const std::vector<int64_t>& shape, c10::ScalarType t);

// Whether this rank writes (and counts in digests) its rows of `t`: the first replica alone, and
// a tensor held whole by every rank (a replicated scalar) only by rank 0.
bool owns(const TensorShard& t, const CheckpointContext& ctx);

std::string read_text(const fs::path& p);
// Written and fsynced, so that a checkpoint renamed into place survives a crash.
void write_text(const fs::path& p, const std::string& text);
int64_t parse_step(const std::string& text, const std::string& where);
json parse_json_file(const fs::path& p);

// Replaces `final_dir` by `tmp`. The old checkpoint is moved aside first and removed last; if
// the process dies in between, recover_interrupted_saves moves it back.
void swap_into_place(const fs::path& tmp, const fs::path& final_dir);

// Runs `local` on this rank, then agrees over all ranks: if any rank failed, every rank throws
// (the failing rank with its own message), so that no rank waits for a peer that gave up. With
// `digests`, their partial sums ride the same all-sum and come back summed over the ranks.
void agree(const CheckpointContext& ctx, const std::string& what, const std::function<void()>& local,
           std::vector<RowDigest>* digests = nullptr);

// After a load: every tensor's digest, summed over the ranks, against the one the checkpoint
// recorded (`recorded` gives it, "" when it has none).
void check_digests(const std::string& dir, const CheckpointState& st, const std::vector<RowDigest>& digests,
                   const std::function<std::string(const std::string&)>& recorded, const char* source,
                   const char* damage);

at::Tensor bytes_to_tensor(std::vector<char>& bytes, const std::vector<int64_t>& shape, int64_t rows,
                           c10::ScalarType t);
// Where a load reads `local`'s rows saved as `saved`: `local` itself when it is contiguous and of
// that dtype (no copy), else a new tensor that finish_load then casts into `local`.
at::Tensor receiving_tensor(const at::Tensor& local, c10::ScalarType saved);
void finish_load(at::Tensor& local, const at::Tensor& received);

// A sharded checkpoint's index.json, checked for format and version.
struct Index {
  json j;
  fs::path dir;
};
Index read_index(const std::string& dir);
std::vector<int64_t> json_shape(const json& j, const std::string& where);

// Readers opened once per file, with the index's recorded size checked first.
class Files {
 public:
  Files(fs::path dir, const json& sizes) : dir_(std::move(dir)), sizes_(sizes) {}
  SafetensorsReader& get(const std::string& file);

 private:
  fs::path dir_;
  json sizes_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> open_;
};

struct Piece {
  std::string file;
  int64_t offset, rows;
};
std::vector<Piece> pieces_of(const json& entry, const std::string& where);

// Reads rows [first, first + count) of tensor `name` from its pieces, checking each piece's
// header against the index. Adds the bytes to `digest` when given.
std::vector<char> read_tensor_rows(Files& files, const std::string& name, const json& entry,
                                   const std::vector<int64_t>& shape, c10::ScalarType dtype, int64_t first,
                                   int64_t count, RowDigest* digest);
// Checks every piece overlapping rows [first, first + count) against its file (dtype, shape) and
// that they cover the rows; calls `f` (when set) with each piece's reader and the rows [lo, hi)
// it holds, starting at row piece_offset. Throws fsdpx::Error naming the tensor or file.
void for_each_piece(Files& files, const std::string& name, const json& entry, const std::vector<int64_t>& shape,
                    c10::ScalarType dtype, int64_t first, int64_t count,
                    const std::function<void(SafetensorsReader&, int64_t lo, int64_t hi, int64_t piece_offset)>& f);
// The whole tensor `name` (`entry` of the index, stored as `dtype` in `shape`), checked against
// the entry's digest; a mismatch is fsdpx::Error "<where>: tensor 'NAME' does not match its digest".
at::Tensor read_whole_tensor(Files& files, const std::string& name, const json& entry,
                             const std::vector<int64_t>& shape, c10::ScalarType dtype, const std::string& where);
// The same into `out` (count rows of `shape` in `dtype`).
void read_tensor_rows_into(Files& files, const std::string& name, const json& entry, const std::vector<int64_t>& shape,
                           c10::ScalarType dtype, int64_t first, int64_t count, char* out, RowDigest* digest);

}  // namespace fsdpx::ckpt
