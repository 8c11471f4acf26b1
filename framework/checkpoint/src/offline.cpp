// Checkpoints read by one process without a process group: inspect, verify, consolidate.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/checkpoint/output_paths.h"
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "checkpoint_files.h"
#include "checkpoint_tensors.h"
#include "dcp_index.h"
#include "piece_reader.h"
#include "sharded_index.h"

namespace fs = std::filesystem;

namespace fsdpx {

using namespace ckpt;

CheckpointInfo inspect_checkpoint(const std::string& path) {
  CheckpointInfo info;
  fs::path p(path);
  if (fs::is_directory(p) && (fs::exists(p / "index.json") || is_dcp_folder(path))) {
    Index ix = read_index(path);
    info.format = ix.j.value("written_by", "") == "dcp" ? "dcp-safetensors" : "fsdpx-sharded";
    info.step = ix.j.value("step", int64_t{0});
    info.world_size = ix.j.value("world_size", 0);
    for (auto it = ix.j["tensors"].begin(); it != ix.j["tensors"].end(); ++it) {
      CheckpointTensorInfo t;
      t.name = it.key();
      t.dtype = it.value().value("dtype", "?");
      t.digest = it.value().value("digest", "");
      t.shape = json_shape(it.value().value("shape", json()), t.name);
      for (const Piece& pc : pieces_of(it.value(), t.name)) t.pieces.push_back({pc.file, {pc.offset, pc.rows}});
      info.tensors.push_back(std::move(t));
    }
    const json file_sizes = ix.j.value("files", json::object());
    for (auto it = file_sizes.begin(); it != file_sizes.end(); ++it)
      if (it.value().is_number_integer()) info.bytes += it.value().get<int64_t>();
    if (fs::exists(p / "trainer_state.json")) info.trainer_state_json = read_text(p / "trainer_state.json");
    if (fs::exists(p / "config.ini")) info.config_ini = read_text(p / "config.ini");
    return info;
  }
  const fs::path named = fs::path(path).lexically_normal();  // "dir/" names dir too
  const std::string base = (named.has_filename() ? named : named.parent_path()).filename().string();
  if (fs::is_directory(p) && base.rfind(".tmp-step-", 0) == 0)
    throw Error(path + " is not a checkpoint: it is a save that never completed (.tmp-: its ranks did not all finish "
                       "writing), which --resume auto passes over; the last complete one is a step-NNNNNNNN beside it");
  if (fs::is_directory(p)) p /= "model.safetensors";
  if (!fs::exists(p))
    throw Error(path + " is not a checkpoint: no index.json (sharded) or model.safetensors (consolidated)");
  SafetensorsReader r(p.string());
  info.format = "safetensors";
  info.bytes = r.file_size();
  info.world_size = 1;
  auto m = r.metadata();
  if (m.count("step")) info.step = parse_step(m["step"], p.string());
  info.trainer_state_json = m.count("trainer_state") ? m["trainer_state"] : "";
  info.config_ini = m.count("config") ? m["config"] : "";
  json digests;
  if (fs::exists(p.parent_path() / "digests.json")) digests = parse_json_file(p.parent_path() / "digests.json");
  for (const auto& [name, e] : r.entries()) {
    CheckpointTensorInfo t;
    t.name = name;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.digest = digests.is_object() && digests.contains(name) && digests[name].is_string()
                   ? digests[name].get<std::string>()
                   : "";
    t.pieces.push_back({p.filename().string(), {0, e.rows()}});
    info.tensors.push_back(std::move(t));
  }
  return info;
}

int64_t verify_checkpoint(const std::string& path) {
  CheckpointInfo info = inspect_checkpoint(path);
  // Every file the format needs, present and parsing, before the bytes are read.
  if (fs::is_directory(path))
    if (const std::string why = checkpoint_problem(path); !why.empty()) throw Error(path + " is not complete: " + why);
  int64_t checked = 0;
  constexpr int64_t kChunk = 64 << 20;
  if (info.format == "fsdpx-sharded" || info.format == "dcp-safetensors") {
    Index ix = read_index(path);
    Files files(path, ix.j.value("files", json::object()));
    for (const auto& t : info.tensors) {
      const json& e = ix.j["tensors"][t.name];
      const c10::ScalarType dt = dtype_from_safetensors(t.dtype);
      const int64_t rb = row_bytes_of(t.shape, dt), rows = rows_of(t.shape);
      const int64_t step = std::max<int64_t>(1, kChunk / std::max<int64_t>(rb, 1));
      RowDigest d;
      d.kind = RowDigest::kind_of(t.digest);
      for (int64_t first = 0; first < rows; first += step)
        read_tensor_rows(files, t.name, e, t.shape, dt, first, std::min(step, rows - first), &d);
      if (!e.value("no_digest", false) && d.hex() != t.digest)
        throw Error(path + ": tensor '" + t.name + "' does not match its digest (" + d.hex() + ", the index says " +
                    t.digest + "): a shard file is corrupted");
      ++checked;
    }
    const json file_sizes = ix.j.value("files", json::object());
    for (auto it = file_sizes.begin(); it != file_sizes.end(); ++it) files.get(it.key());
    return checked;
  }
  fs::path p(path);
  if (fs::is_directory(p)) p /= "model.safetensors";
  SafetensorsReader r(p.string());
  for (const auto& t : info.tensors) {
    const SafetensorsEntry& e = r.entry(t.name);
    const int64_t rb = e.row_bytes(), rows = e.rows();
    const int64_t step = std::max<int64_t>(1, kChunk / std::max<int64_t>(rb, 1));
    RowDigest d;
    d.kind = RowDigest::kind_of(t.digest);
    for (int64_t first = 0; first < rows; first += step) {
      const int64_t n = std::min(step, rows - first);
      std::vector<char> bytes = r.read_rows(t.name, first, n);
      d.add_rows(bytes.data(), first, n, rb);
    }
    if (!t.digest.empty() && d.hex() != t.digest)
      throw Error(p.string() + ": tensor '" + t.name + "' does not match its digest (" + d.hex() +
                  ", digests.json says " + t.digest + ")");
    ++checked;
  }
  return checked;
}

void consolidate_checkpoint(const std::string& dir, const std::string& out, bool with_optimizer) {
  check_output_file(out, "the output", {{"the checkpoint", dir}});
  Index ix = read_index(dir);
  Files files(dir, ix.j.value("files", json::object()));
  std::vector<SafetensorsWriter::Spec> specs;
  for (auto it = ix.j["tensors"].begin(); it != ix.j["tensors"].end(); ++it) {
    if (!with_optimizer && it.key().rfind(kOptimPrefix, 0) == 0) continue;
    specs.push_back(
        {it.key(), dtype_from_safetensors(it.value().value("dtype", "")), json_shape(it.value()["shape"], it.key())});
  }
  std::map<std::string, std::string> meta{{"format", "fsdpx-consolidated"},
                                          {"step", std::to_string(ix.j.value("step", 0))}};
  if (fs::exists(fs::path(dir) / "trainer_state.json"))
    meta["trainer_state"] = read_text(fs::path(dir) / "trainer_state.json");
  if (fs::exists(fs::path(dir) / "config.ini")) meta["config"] = read_text(fs::path(dir) / "config.ini");
  TempOutput tmp(out);  // removed on any failure: no partial file is left behind
  SafetensorsWriter w(tmp.path(), specs, meta);
  for (const auto& s : specs)
    w.write(read_whole_tensor(files, s.name, ix.j["tensors"][s.name], s.shape, s.dtype,
                              dir + " (not consolidating a corrupted checkpoint)"));
  w.close();
  tmp.commit();
}

}  // namespace fsdpx
