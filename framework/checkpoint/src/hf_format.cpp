// Hugging Face directories: initial weights read from one (each rank its own rows), and a
// checkpoint written as one (config.json, model.safetensors or shards with their index).
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/dtype_name.h"
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/checkpoint/output_paths.h"
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "fsdpx/suggest.h"
#include "checkpoint_files.h"
#include "checkpoint_tensors.h"
#include "piece_reader.h"
#include "rank_agreement.h"
#include "sharded_index.h"

namespace fs = std::filesystem;

namespace fsdpx {

using namespace ckpt;

namespace {

constexpr const char* kIndexFile = "model.safetensors.index.json";

// Which file holds each tensor: the index's weight_map, or every tensor of model.safetensors.
std::map<std::string, fs::path> hf_files(const std::string& dir, const std::string& what) {
  const fs::path d(dir), index = d / kIndexFile, single = d / "model.safetensors";
  std::map<std::string, fs::path> out;
  if (fs::exists(index)) {
    const json j = parse_json_file(index);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string() + ": no \"weight_map\" object of tensor names to files");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      const std::string file = it.value().is_string() ? it.value().get<std::string>() : "";
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        throw Error(index.string() + ": tensor '" + it.key() + "' maps to " + it.value().dump() +
                    ", not the name of a file beside the index");
      out[it.key()] = d / file;
    }
    return out;
  }
  if (!fs::exists(single))
    throw Error(what + ": neither model.safetensors nor " + kIndexFile +
                " there; give the directory save_pretrained wrote");
  const SafetensorsReader file(single.string());
  for (const auto& [name, entry] : file.entries()) out[name] = single;
  return out;
}

// Throws naming the first parameter the files lack, or the first tensor no parameter takes.
void check_names(const std::string& what, const CheckpointState& st, const std::map<std::string, fs::path>& files,
                 const std::function<std::string(const std::string&)>& hf_name,
                 const std::function<bool(const std::string&)>& ignorable) {
  std::set<std::string> wanted;
  for (const TensorShard& t : st.tensors) {
    const std::string hf = hf_name(t.name);
    if (!files.count(hf))
      throw Error(what + " has no tensor '" + hf + "' (the model's '" + t.name +
                  "'); is it a checkpoint of this architecture?");
    wanted.insert(hf);
  }
  for (const auto& [name, file] : files)
    if (!wanted.count(name) && !ignorable(name))
      throw Error(what + ": " + file.filename().string() + " holds tensor '" + name +
                  "', which no parameter of this model "
                  "takes" +
                  did_you_mean(name, std::vector<std::string>(wanted.begin(), wanted.end())) +
                  " (is config.json the one of these weights?)");
}

}  // namespace

void load_hf_weights(const std::string& dir, CheckpointState& st, const CheckpointContext& ctx,
                     const std::function<std::string(const std::string&)>& hf_name,
                     const std::function<bool(const std::string&)>& ignorable) {
  const std::string what = "--model.from_hf " + dir;
  std::map<std::string, fs::path> files;
  std::string error;
  try {
    files = hf_files(dir, what);
    check_names(what, st, files, hf_name, ignorable);
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::vector<int64_t> failed{error.empty() ? 0 : 1};
  ctx.all_sum(failed);  // every rank stops together
  if (failed[0] > 0) throw Error(error.empty() ? what + ": another rank could not read it" : error);
  agree(ctx, "loading " + what, [&] {
    at::NoGradGuard no_grad;
    std::map<fs::path, std::unique_ptr<SafetensorsReader>> open;
    for (TensorShard& t : st.tensors) {
      const std::string hf = hf_name(t.name);
      const fs::path& path = files.at(hf);
      auto& reader = open[path];
      if (!reader) reader = std::make_unique<SafetensorsReader>(path.string());
      const SafetensorsEntry& e = reader->entry(hf);
      if (e.shape != t.global_shape)
        throw Error(path.string() + ": tensor '" + hf + "' has shape " + shape_text(e.shape) + ", the model's '" +
                    t.name + "' is " + shape_text(t.global_shape));
      const int64_t n = rows_of(t.local);
      if (n == 0) continue;
      at::Tensor into = receiving_tensor(t.local, e.scalar_type);
      reader->read_rows_into(hf, t.row_offset, n, static_cast<char*>(into.data_ptr()));
      finish_load(t.local, into);  // to the parameter's dtype
    }
  });
}

namespace {

struct ExportTensor {
  std::string name, hf;
  c10::ScalarType stored, dtype;  // in the checkpoint; written
  std::vector<int64_t> shape;
  int64_t bytes = 0;              // written
};

// The whole tensor `name` of a checkpoint, checked against its digest.
class CheckpointTensors {
 public:
  explicit CheckpointTensors(const std::string& path) : path_(path) {
    const fs::path p(path);
    if (fs::is_directory(p) && fs::exists(p / "index.json")) {
      index_ = read_index(path).j;
      files_ = std::make_unique<Files>(p, index_.value("files", json::object()));
    } else {
      const fs::path file = fs::is_directory(p) ? p / "model.safetensors" : p;
      reader_ = std::make_unique<SafetensorsReader>(file.string());
      const fs::path dj = file.parent_path() / "digests.json";
      digests_ = fs::exists(dj) ? parse_json_file(dj) : json::object();
    }
  }

  at::Tensor read(const ExportTensor& t) {
    const int64_t rows = rows_of(t.shape);
    if (files_) return read_whole_tensor(*files_, t.name, index_["tensors"][t.name], t.shape, t.stored, path_);
    at::Tensor whole = reader_->read(t.name);
    if (digests_.contains(t.name) && digests_[t.name].is_string()) {
      RowDigest d;
      d.kind = RowDigest::kind_of(digests_[t.name].get<std::string>());
      d.add_rows(static_cast<const char*>(whole.data_ptr()), 0, rows, row_bytes_of(t.shape, t.stored));
      if (d.hex() != digests_[t.name].get<std::string>())
        throw Error(path_ + ": tensor '" + t.name + "' does not match digests.json");
    }
    return whole;
  }

 private:
  std::string path_;
  json index_, digests_;
  std::unique_ptr<Files> files_;
  std::unique_ptr<SafetensorsReader> reader_;
};

std::string shard_name(size_t k, size_t n) {
  char b[64];
  std::snprintf(b, sizeof b, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return b;
}

const char* hf_dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "float32";
    case c10::kBFloat16: return "bfloat16";
    case c10::kHalf: return "float16";
    case c10::kDouble: return "float64";
    default: return "float32";
  }
}

}  // namespace

HfExport export_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& o) {
  const CheckpointInfo info = inspect_checkpoint(checkpoint);
  std::vector<ExportTensor> tensors;
  for (const auto& t : info.tensors) {
    if (t.name.rfind(kOptimPrefix, 0) == 0) continue;
    const c10::ScalarType stored = dtype_from_safetensors(t.dtype);
    ExportTensor e{t.name, o.hf_name(t.name), stored, o.dtype ? *o.dtype : stored, t.shape, 0};
    e.bytes = row_bytes_of(t.shape, e.dtype) * rows_of(t.shape);
    tensors.push_back(std::move(e));
  }
  if (tensors.empty()) throw Error(checkpoint + " holds no model tensors to export");
  // Shards of at most max_shard_bytes (a larger tensor gets one of its own), in the checkpoint's order.
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!shards.back().empty() && in_shard + tensors[i].bytes > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += tensors[i].bytes;
    total += tensors[i].bytes;
  }
  check_output_dir(out_dir, "export-hf's output", {{"the checkpoint", checkpoint}});
  TempOutput staging(out_dir);  // removed on any failure: nothing half-written is left behind
  const fs::path tmp = staging.path();
  fs::create_directories(tmp);
  CheckpointTensors source(checkpoint);
  json weight_map = json::object();
  HfExport result;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = shards.size() == 1 ? "model.safetensors" : shard_name(k, shards.size());
    std::vector<SafetensorsWriter::Spec> specs;
    for (size_t i : shards[k]) specs.push_back({tensors[i].hf, tensors[i].dtype, tensors[i].shape});
    SafetensorsWriter w((tmp / file).string(), specs, {{"format", "pt"}});  // transformers asks for "pt"
    for (size_t i : shards[k]) {
      at::Tensor t = source.read(tensors[i]);
      w.write(t.scalar_type() == tensors[i].dtype ? t : t.to(tensors[i].dtype));
      weight_map[tensors[i].hf] = file;
    }
    w.close();
    result.files.push_back(file);
  }
  if (shards.size() > 1)
    write_text(tmp / kIndexFile, json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2));
  json config = json::parse(o.config_json);
  config["dtype"] = hf_dtype_name(tensors.front().dtype);
  if (config.contains("torch_dtype")) config["torch_dtype"] = config["dtype"];
  write_text(tmp / "config.json", config.dump(2));
  fsync_directory(tmp.string());
  staging.commit();
  result.tensors = static_cast<int64_t>(tensors.size());
  result.bytes = total;
  return result;
}

}  // namespace fsdpx
