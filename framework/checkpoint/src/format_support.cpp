#include "format_support.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <ATen/ops/from_blob.h>

#include "fsdpx/error.h"
#include "fsdpx/files.h"

namespace fsdpx::ckpt {


int64_t row_bytes_of(const std::vector<int64_t>& shape, c10::ScalarType t) {
  return row_numel(shape) * static_cast<int64_t>(c10::elementSize(t));
}

// Whether this rank writes (and counts in digests) its rows of `t`: the first replica alone, and
// a tensor held whole by every rank (a replicated scalar) only by rank 0.
bool owns(const TensorShard& t, const CheckpointContext& ctx) {
  const int64_t local = rows_of(t.local);
  if (local == 0 || !ctx.primary) return false;
  return local < rows_of(t.global_shape) || ctx.rank == 0;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p.string() + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Written and fsynced, so that a checkpoint renamed into place survives a crash.
void write_text(const fs::path& p, const std::string& text) { write_file_synced(p.string(), text); }

int64_t parse_step(const std::string& text, const std::string& where) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 0) throw Error(where + ": step '" + text + "' is not a step number");
  return v;
}

json parse_json_file(const fs::path& p) {
  try {
    return json::parse(read_text(p));
  } catch (const json::exception& e) {
    throw Error(p.string() + ": not valid JSON (" + e.what() + ")");
  }
}

// Replaces `final_dir` by `tmp`. The old checkpoint is moved aside first and removed last; if
// the process dies in between, recover_interrupted_saves moves it back.
void swap_into_place(const fs::path& tmp, const fs::path& final_dir) {
  const fs::path root = final_dir.parent_path();
  std::error_code ec;
  if (fs::exists(final_dir)) {
    const fs::path old = root / (".old-" + final_dir.filename().string());
    fs::remove_all(old, ec);
    fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_directory(root.string());
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp, final_dir);
  }
  fsync_directory(root.string());
}

// Runs `local` on this rank, then agrees over all ranks: if any rank failed, every rank throws
// (the failing rank with its own message), so that no rank waits for a peer that gave up.
void agree(const CheckpointContext& ctx, const std::string& what, const std::function<void()>& local,
           std::vector<RowDigest>* digests) {
  std::string error;
  try {
    local();
  } catch (const std::exception& e) {
    error = e.what();
  }
  // One all-sum carries every rank's failure flag and, on load, the digests' partial sums.
  std::vector<int64_t> sums(static_cast<size_t>(ctx.world_size), 0);
  sums[static_cast<size_t>(ctx.rank)] = error.empty() ? 0 : 1;
  if (digests)
    for (const auto& d : *digests) {
      sums.push_back(d.lo);
      sums.push_back(d.hi);
    }
  if (ctx.all_sum) ctx.all_sum(sums);
  if (!error.empty()) throw Error(error);
  for (int r = 0; r < ctx.world_size; ++r)
    if (sums[static_cast<size_t>(r)])
      throw Error(what + " failed on rank " + std::to_string(r) + " (its log says why)");
  if (digests)
    for (size_t i = 0; i < digests->size(); ++i) {
      const size_t at = static_cast<size_t>(ctx.world_size) + 2 * i;
      (*digests)[i].lo = sums[at];  // the kind stays the one the load chose
      (*digests)[i].hi = sums[at + 1];
    }
}

// After a load: every tensor's digest, summed over the ranks, against the one the checkpoint
// recorded (`recorded` gives it, "" when it has none).
void check_digests(const std::string& dir, const CheckpointState& st, const std::vector<RowDigest>& digests,
                   const std::function<std::string(const std::string&)>& recorded, const char* source,
                   const char* damage) {
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    const std::string& name = st.tensors[i].name;
    const std::string want = recorded(name);
    if (want.empty()) continue;
    const std::string got = digests[i].hex();
    if (got != want)
      throw Error("checkpoint " + dir + ": tensor '" + name + "' does not match its digest (" + got + ", " + source +
                  " says " + want + "): " + damage);
  }
}

at::Tensor bytes_to_tensor(std::vector<char>& bytes, const std::vector<int64_t>& shape, int64_t rows,
                           c10::ScalarType t) {
  std::vector<int64_t> s = shape.empty() ? std::vector<int64_t>{} : shape;
  if (!s.empty()) s[0] = rows;
  return at::from_blob(bytes.data(), s, at::TensorOptions().dtype(t)).clone();
}

at::Tensor receiving_tensor(const at::Tensor& local, c10::ScalarType saved) {
  if (local.scalar_type() == saved && local.is_contiguous()) return local;
  return at::empty(local.sizes(), local.options().dtype(saved).memory_format(at::MemoryFormat::Contiguous));
}

void finish_load(at::Tensor& local, const at::Tensor& received) {
  if (!received.is_same(local)) local.copy_(received);  // casts when the run stores another dtype
}


namespace {

// The index's fields, each of the type the readers take it as (json::value() throws a
// json::type_error on a field of another type: found by tests/fuzz/fuzz_checkpoint_index).
void check_index_fields(const json& j, const std::string& where) {
  auto field = [&](const json& obj, const char* key, json::value_t type, const std::string& in, bool required) {
    const bool has = obj.contains(key);
    if (!has && required) throw Error(where + ": " + in + "has no \"" + key + "\"");
    const bool ok = !has || obj[key].type() == type ||
                    (type == json::value_t::number_integer && obj[key].is_number_integer());
    if (!ok)
      throw Error(where + ": " + in + "\"" + key + "\" is " + obj[key].type_name() + ", not " + json(type).type_name());
  };
  if (!j.is_object()) throw Error(where + ": not an fsdpx sharded checkpoint index (not a JSON object)");
  field(j, "format", json::value_t::string, "", true);
  field(j, "version", json::value_t::number_integer, "", true);
  field(j, "step", json::value_t::number_integer, "", false);
  field(j, "world_size", json::value_t::number_integer, "", false);
  field(j, "tensors", json::value_t::object, "", true);
  field(j, "files", json::value_t::object, "", false);
  for (auto it = j["tensors"].begin(); it != j["tensors"].end(); ++it) {
    const std::string in = "tensor '" + it.key() + "' ";
    if (!it.value().is_object()) throw Error(where + ": " + in + "is not an object");
    field(it.value(), "dtype", json::value_t::string, in, true);
    field(it.value(), "digest", json::value_t::string, in, false);
    field(it.value(), "shape", json::value_t::array, in, true);
    field(it.value(), "pieces", json::value_t::array, in, true);
  }
}

}  // namespace

Index read_index(const std::string& dir) {
  const std::string kind = file_kind(dir);
  if (kind == "missing") throw Error(dir + " does not exist; give a checkpoint directory (step-NNNNNNNN)");
  if (kind != "a directory")
    throw Error(dir + " is " + (kind.empty() ? "a file" : kind) + ", not a checkpoint directory");
  const fs::path p = fs::path(dir) / "index.json";
  if (!fs::exists(p)) {
    if (fs::exists(fs::path(dir) / "model.safetensors"))
      throw Error(dir +
                  " is a consolidated checkpoint (model.safetensors), not a sharded one (fsdpx-train loads it with "
                  "--checkpoint.name consolidated; it is already one file, nothing to consolidate)");
    throw Error(dir + " is not a checkpoint: it has no index.json (an interrupted save leaves only a .tmp- directory)");
  }
  Index ix{json(), dir};
  try {
    ix.j = json::parse(read_text(p));
  } catch (const json::exception& e) {
    throw Error(p.string() + ": not valid JSON (" + e.what() + ")");
  }
  check_index_fields(ix.j, p.string());
  if (ix.j["format"] != "fsdpx-sharded") throw Error(p.string() + ": not an fsdpx sharded checkpoint index");
  if (ix.j.value("version", 0) != 1)
    throw Error(p.string() + ": format version " + std::to_string(ix.j.value("version", 0)) +
                ", this fsdpx reads version 1");
  return ix;
}

std::vector<int64_t> json_shape(const json& j, const std::string& where) {
  if (!j.is_array()) throw Error(where + ": shape is not a list");
  std::vector<int64_t> s;
  // Bytes are counted in int64: at most 2^59 elements (of up to 8 bytes), far beyond any file.
  constexpr int64_t kMaxElements = int64_t{1} << 59;
  int64_t elements = 1;
  for (const auto& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      throw Error(where + ": shape " + j.dump() + " is not a list of sizes");
    const int64_t n = d.get<int64_t>();
    if (n > 0 && elements > kMaxElements / n)
      throw Error(where + ": shape " + j.dump() + " holds more than 2^59 elements (the index is damaged)");
    elements = n == 0 ? 0 : elements * n;
    s.push_back(n);
  }
  return s;
}

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
std::vector<Piece> pieces_of(const json& entry, const std::string& where) {
  std::vector<Piece> out;
  if (!entry.contains("pieces") || !entry["pieces"].is_array()) throw Error(where + ": no pieces");
  for (const auto& p : entry["pieces"]) {
    if (!p.is_object() || !p.contains("file") || !p.contains("row_offset") || !p.contains("rows") ||
        !p["file"].is_string() || !p["row_offset"].is_number_integer() || !p["rows"].is_number_integer())
      throw Error(where + ": a piece lacks file, row_offset or rows");
    out.push_back({p["file"].get<std::string>(), p["row_offset"].get<int64_t>(), p["rows"].get<int64_t>()});
  }
  return out;
}

// Reads rows [first, first + count) of tensor `name` from its pieces, checking each piece's
// header against the index. Adds the bytes to `digest` when `count_digest`.
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
  if (d.hex() != entry.value("digest", "")) throw Error(where + ": tensor '" + name + "' does not match its digest");
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
