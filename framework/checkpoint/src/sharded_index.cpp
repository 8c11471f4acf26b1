// A sharded checkpoint's index.json: read and checked for format and version, its shapes and pieces.
#include "sharded_index.h"

#include "checkpoint_files.h"
#include "dcp_index.h"
#include "fsdpx/error.h"
#include "fsdpx/files.h"

namespace fsdpx::ckpt {

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
  field(j, "written_by", json::value_t::string, "", false);
  for (auto it = j["tensors"].begin(); it != j["tensors"].end(); ++it) {
    const std::string in = "tensor '" + it.key() + "' ";
    if (!it.value().is_object()) throw Error(where + ": " + in + "is not an object");
    field(it.value(), "dtype", json::value_t::string, in, true);
    field(it.value(), "digest", json::value_t::string, in, false);
    field(it.value(), "shape", json::value_t::array, in, true);
    field(it.value(), "pieces", json::value_t::array, in, true);
    if (it.value().contains("no_digest"))  // what dcp_index marks; an fsdpx index always has its digests
      throw Error(where + ": " + in + "has \"no_digest\", which only the index of a folder PyTorch's DCP wrote holds");
  }
}

}  // namespace

Index read_index(const std::string& dir) {
  const std::string kind = file_kind(dir);
  if (kind == "missing") throw Error(dir + " does not exist; give a checkpoint directory (step-NNNNNNNN)");
  if (kind != "a directory")
    throw Error(dir + " is " + (kind.empty() ? "a file" : kind) + ", not a checkpoint directory");
  const fs::path p = fs::path(dir) / "index.json";
  if (is_dcp_folder(dir)) return Index{dcp_index(dir), dir};  // PyTorch's DCP, as safetensors
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

}  // namespace fsdpx::ckpt
