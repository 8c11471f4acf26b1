#include "dcp_index.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/dtype_name.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "checkpoint_tensors.h"

namespace fsdpx::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

bool is_dcp_file(const fs::path& p) {
  const std::string ext = p.extension().string();
  return fs::is_regular_file(p) && (ext == ".safetensors" || ext == ".distcp");
}

std::vector<fs::path> dcp_files(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_dcp_file(e.path())) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

struct Chunk {
  std::string file, dtype;
  std::vector<int64_t> row_shape;  // the shape without dim 0 (a scalar: none)
  int64_t offset = 0, rows = 0;
  bool scalar = false;
};

// A file's chunks, by tensor name.
void add_chunks(const fs::path& path, std::map<std::string, std::vector<Chunk>>& chunks) {
  const std::string file = path.filename().string();
  std::unique_ptr<SafetensorsReader> reader;
  try {
    reader = std::make_unique<SafetensorsReader>(path.string());
  } catch (const Error& e) {
    if (path.extension() == ".distcp")
      throw Error(path.string() + " is not safetensors: DCP's default FileSystemWriter pickles its files, which "
                  "fsdpx does not read; save with FileSystemWriter(path, serialization_format="
                  "SerializationFormat.SAFETENSORS) or HuggingFaceStorageWriter(path, save_distributed=True), or "
                  "convert this one: python scripts/dcp_to_safetensors.py " + path.parent_path().string() + " OUT");
    throw;
  }
  json info = json::object();
  const auto& meta = reader->metadata();
  if (auto it = meta.find("DCP_SHARDING_INFO"); it != meta.end()) {
    try {
      info = json::parse(it->second);
    } catch (const json::exception&) {
      throw Error(path.string() + ": its DCP_SHARDING_INFO is not JSON");
    }
    if (!info.is_object()) throw Error(path.string() + ": its DCP_SHARDING_INFO is not a JSON object");
  }
  for (const auto& [name, e] : reader->entries()) {
    const std::string where = "tensor '" + name + "' in " + path.string();
    std::vector<int64_t> offsets(e.shape.size(), 0);
    if (!info.empty()) {
      if (!info.contains(name) || !info[name].is_object() || !info[name].contains("saved_offsets"))
        throw Error(where + " has no saved_offsets in the file's DCP_SHARDING_INFO");
      const json& o = info[name]["saved_offsets"];
      if (!o.is_array() || o.size() != e.shape.size())
        throw Error(where + ": saved_offsets " + o.dump() + " is not one offset per dimension of " +
                    shape_text(e.shape));
      for (size_t d = 0; d < o.size(); ++d) {
        if (!o[d].is_number_integer() || o[d].get<int64_t>() < 0)
          throw Error(where + ": saved_offsets " + o.dump() + " is not a list of offsets");
        offsets[d] = o[d].get<int64_t>();
      }
    }
    for (size_t d = 1; d < offsets.size(); ++d)
      if (offsets[d] != 0)
        throw Error(where + " is a chunk at offsets " + json(offsets).dump() + ", cut along dimension " +
                    std::to_string(d) + ": fsdpx reads tensors split by rows (dimension 0), as FSDP shards them, "
                    "not tensor-parallel chunks");
    Chunk c{file, e.dtype, {}, offsets.empty() ? 0 : offsets[0], e.rows(), e.shape.empty()};
    if (!e.shape.empty()) c.row_shape.assign(e.shape.begin() + 1, e.shape.end());
    chunks[name].push_back(std::move(c));
  }
}

// A tensor's index entry from its chunks: one dtype and row shape, its rows each in exactly one.
json entry_of(const std::string& name, std::vector<Chunk> cs, const std::string& dir) {
  const std::string where = "checkpoint " + dir + ": tensor '" + name + "'";
  std::sort(cs.begin(), cs.end(), [](const Chunk& a, const Chunk& b) { return a.offset < b.offset; });
  const Chunk& first = cs.front();
  json pieces = json::array();
  int64_t next = 0;
  for (const Chunk& c : cs) {
    if (c.dtype != first.dtype)
      throw Error(where + " is " + first.dtype + " in " + first.file + " and " + c.dtype + " in " + c.file);
    if (c.row_shape != first.row_shape || c.scalar != first.scalar)
      throw Error(where + " has rows of shapes " + shape_text(first.row_shape) + " (" + first.file + ") and " +
                  shape_text(c.row_shape) + " (" + c.file + ")");
    if (c.offset > next)
      throw Error(where + ": rows [" + std::to_string(next) + ", " + std::to_string(c.offset) + ") are in no file");
    if (c.offset < next)
      throw Error(where + ": rows from " + std::to_string(c.offset) + " are in two files (" + c.file +
                  " and one before it)");
    pieces.push_back({{"file", c.file}, {"row_offset", c.offset}, {"rows", c.rows}});
    next = c.offset + c.rows;
  }
  std::vector<int64_t> shape;
  if (!first.scalar) {
    shape.push_back(next);
    shape.insert(shape.end(), first.row_shape.begin(), first.row_shape.end());
  }
  // DCP records no digests: readers check sizes and coverage only (read_whole_tensor, verify).
  return {{"dtype", first.dtype}, {"shape", shape}, {"pieces", pieces}, {"no_digest", true}};
}

}  // namespace

bool is_dcp_folder(const std::string& dir) {
  std::error_code ec;
  // model.safetensors: fsdpx's consolidated checkpoint, or a Hugging Face directory (DCP names its
  // files shard-*-model-* and model-*-of-*).
  if (!fs::is_directory(dir, ec) || fs::exists(fs::path(dir) / "index.json") ||
      fs::exists(fs::path(dir) / "trainer_state.json") || fs::exists(fs::path(dir) / "model.safetensors"))
    return false;
  const std::vector<fs::path> files = dcp_files(dir);
  // fsdpx's own sharded folder without its index (a save cut short) is incomplete, not DCP's.
  for (const fs::path& f : files)
    if (f.filename().string().rfind("rank-", 0) == 0) return false;
  return !files.empty();
}

json dcp_index(const std::string& dir) {
  std::map<std::string, std::vector<Chunk>> chunks;
  for (const fs::path& p : dcp_files(dir)) add_chunks(p, chunks);
  json tensors = json::object(), files = json::object();
  for (const auto& [_, cs] : chunks)  // the files that hold tensors, at the sizes read now
    for (const Chunk& c : cs) files[c.file] = static_cast<int64_t>(fs::file_size(fs::path(dir) / c.file));
  for (auto& [name, cs] : chunks) tensors[name] = entry_of(name, std::move(cs), dir);
  return json{{"format", "fsdpx-sharded"}, {"version", 1}, {"step", 0}, {"tensors", tensors},
              {"files", files}, {"written_by", "dcp"}};
}

}  // namespace fsdpx::ckpt

namespace fsdpx {

namespace {

using ckpt::kOptimPrefix;

// The names, in dcp_names' order, that `name` may be held under.
std::vector<std::string> candidates(const std::string& name, const OtherNames& other_names) {
  auto names_of = [&](const std::string& p) {
    std::vector<std::string> out{p};
    if (other_names)
      for (auto& o : other_names(p)) out.push_back(std::move(o));
    return out;
  };
  std::vector<std::string> out{name};
  const size_t slash = name.rfind('/');
  if (name.rfind(kOptimPrefix, 0) != 0 || slash < std::string(kOptimPrefix).size()) {
    out.push_back("model." + name);
    const std::vector<std::string> others = names_of(name);
    out.insert(out.end(), others.begin() + 1, others.end());
    return out;
  }
  const size_t first = std::string(kOptimPrefix).size();
  const std::string param = name.substr(first, slash - first), key = name.substr(slash + 1);
  for (const std::string& q : names_of(param))
    for (const char* prefix : {"", "optim.", "optimizer."}) out.push_back(prefix + ("state." + q + "." + key));
  return out;
}

}  // namespace

bool is_dcp_checkpoint(const std::string& dir) { return ckpt::is_dcp_folder(dir); }

std::vector<std::string> dcp_names(const std::string& dir, const std::vector<std::string>& names,
                                   const OtherNames& other_names) {
  const nlohmann::json index = ckpt::dcp_index(dir);
  const nlohmann::json& held = index["tensors"];
  std::vector<std::string> out;
  for (const std::string& name : names) {
    const std::vector<std::string> c = candidates(name, other_names);
    auto it = std::find_if(c.begin(), c.end(), [&](const std::string& n) { return held.contains(n); });
    out.push_back(it == c.end() ? name : *it);
  }
  return out;
}

}  // namespace fsdpx
