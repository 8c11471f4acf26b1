// Reading a tensor's rows from a sharded checkpoint's pieces, each checked against its file.
#include "piece_reader.h"

#include <algorithm>
#include <system_error>

#include "checkpoint_tensors.h"
#include "fsdpx/error.h"
#include "fsdpx/framework/base/dtype_name.h"
#include "fsdpx/framework/base/shard_geometry.h"
#include "sharded_index.h"

namespace fsdpx::ckpt {

SafetensorsReader& Files::get(const std::string& file) {
  auto it = open_.find(file);
  if (it != open_.end()) return *it->second;
  if (file.find('/') != std::string::npos || file.find("..") != std::string::npos)
    throw Error((dir_ / "index.json").string() + ": file name '" + file + "' leaves the checkpoint directory");
  const fs::path p = dir_ / file;
  std::error_code ec;
  const auto size = fs::file_size(p, ec);
  if (ec) throw Error(p.string() + ": missing (" + ec.message() + ")");
  if (sizes_.contains(file) && sizes_[file].is_number_integer() &&
      static_cast<int64_t>(size) != sizes_[file].get<int64_t>())
    throw Error(p.string() + ": " + std::to_string(size) + " bytes, the index records " +
                std::to_string(sizes_[file].get<int64_t>()) + " (truncated or replaced)");
  return *open_.emplace(file, std::make_unique<SafetensorsReader>(p.string())).first->second;
}

// Reads rows [first, first + count) of tensor `name` from its pieces, checking each piece's
// header against the index. Adds the bytes to `digest` when given.
std::vector<char> read_tensor_rows(Files& files, const std::string& name, const json& entry,
                                   const std::vector<int64_t>& shape, c10::ScalarType dtype, int64_t first,
                                   int64_t count, RowDigest* digest) {
  // The pieces first: each matches its file, which bounds the bytes (an index may claim any shape).
  for_each_piece(files, name, entry, shape, dtype, first, count, nullptr);
  std::vector<char> out(static_cast<size_t>(count * row_bytes_of(shape, dtype)));
  read_tensor_rows_into(files, name, entry, shape, dtype, first, count, out.data(), digest);
  return out;
}

at::Tensor read_whole_tensor(Files& files, const std::string& name, const json& entry,
                             const std::vector<int64_t>& shape, c10::ScalarType dtype, const std::string& where) {
  RowDigest d;
  d.kind = RowDigest::kind_of(entry.value("digest", ""));
  const int64_t rows = rows_of(shape);
  std::vector<char> bytes = read_tensor_rows(files, name, entry, shape, dtype, 0, rows, &d);
  if (!entry.value("no_digest", false) && d.hex() != entry.value("digest", ""))
    throw Error(where + ": tensor '" + name + "' does not match its digest");
  return bytes_to_tensor(bytes, shape, rows, dtype).reshape(shape);
}

void for_each_piece(Files& files, const std::string& name, const json& entry, const std::vector<int64_t>& shape,
                    c10::ScalarType dtype, int64_t first, int64_t count,
                    const std::function<void(SafetensorsReader&, int64_t lo, int64_t hi, int64_t piece_offset)>& f) {
  const std::string where = "tensor '" + name + "'";
  int64_t covered = 0;
  for (const Piece& p : pieces_of(entry, where)) {
    const int64_t lo = std::max(first, p.offset), hi = std::min(first + count, p.offset + p.rows);
    if (lo >= hi) continue;
    SafetensorsReader& r = files.get(p.file);
    const SafetensorsEntry& e = r.entry(name);
    std::vector<int64_t> piece_shape = shape;
    if (!piece_shape.empty()) piece_shape[0] = p.rows;
    if (e.scalar_type != dtype || e.shape != piece_shape)
      throw Error(r.path() + ": " + where + " is " + e.dtype + " " + shape_text(e.shape) + ", the index says " +
                  safetensors_dtype(dtype) + " " + shape_text(piece_shape));
    if (f) f(r, lo, hi, p.offset);
    covered += hi - lo;
  }
  if (covered != count)
    throw Error(where + ": the checkpoint's pieces cover " + std::to_string(covered) + " of rows " +
                std::to_string(first) + ".." + std::to_string(first + count) + " (the index is damaged)");
}

void read_tensor_rows_into(Files& files, const std::string& name, const json& entry, const std::vector<int64_t>& shape,
                           c10::ScalarType dtype, int64_t first, int64_t count, char* out, RowDigest* digest) {
  const int64_t rb = row_bytes_of(shape, dtype);
  for_each_piece(files, name, entry, shape, dtype, first, count,
                 [&](SafetensorsReader& r, int64_t lo, int64_t hi, int64_t piece_offset) {
                   char* dst = out + (lo - first) * rb;
                   r.read_rows_into(name, lo - piece_offset, hi - lo, dst);
                   if (digest) digest->add_rows(dst, lo, hi - lo, rb);
                 });
}

}  // namespace fsdpx::ckpt
