// Reading a tensor's rows from a sharded checkpoint's pieces, each checked against its file.
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

#include "fsdpx/framework/checkpoint/row_digest.h"
#include "fsdpx/framework/checkpoint/safetensors.h"

namespace fsdpx::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

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
