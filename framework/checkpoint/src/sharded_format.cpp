// The sharded format: every rank writes its rows; an index makes the checkpoint loadable at any
// world size and strategy (checkpointing.h describes the files).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/dtype_name.h"
#include "fsdpx/framework/base/fault_injection.h"
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "checkpoint_files.h"
#include "checkpoint_tensors.h"
#include "piece_reader.h"
#include "rank_agreement.h"
#include "sharded_index.h"

namespace fs = std::filesystem;

namespace fsdpx {

using namespace ckpt;

namespace {

std::string rank_file(const char* pattern, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, pattern, rank);
  return name;
}

// For a folder PyTorch's DCP wrote, the other names a missing tensor was looked for under (dcp_names).
std::string dcp_names_tried(const Index& ix, const std::string& name) {
  if (ix.j.value("written_by", "") != "dcp") return "";
  const size_t slash = name.rfind('/');
  if (name.rfind(kOptimPrefix, 0) != 0 || slash == std::string::npos)
    return " (nor model." + name + ", nor under the model's names in other trainers)";
  return " (nor under DCP's flattened optimizer names, state.<p>." + name.substr(slash + 1) +
         " with no prefix, optim. or optimizer.: was the optimizer's state saved?)";
}

// Rank 0: the index's tensors and files from every rank's piece list (which it removes), each
// tensor's rows checked to be covered exactly once and its digest summed.
json assemble_index(const std::string& dir, const fs::path& tmp, int64_t step, int world_size) {
  json tensors = json::object(), files = json::object();
  std::map<std::string, RowDigest> digests;
  for (int r = 0; r < world_size; ++r) {
    const fs::path js = tmp / rank_file("rank-%05d.json", r);
    json part = json::parse(read_text(js));
    const std::string f = part["file"].get<std::string>();
    if (!f.empty()) files[f] = static_cast<int64_t>(fs::file_size(tmp / f));
    for (auto it = part["pieces"].begin(); it != part["pieces"].end(); ++it) {
      const json& p = it.value();
      json& e = tensors[it.key()];
      if (e.is_null()) e = {{"dtype", p["dtype"]}, {"shape", p["shape"]}, {"pieces", json::array()}};
      if (e["dtype"] != p["dtype"] || e["shape"] != p["shape"])
        throw Error("checkpoint " + dir + ": ranks disagree on the dtype or shape of '" + it.key() + "'");
      e["pieces"].push_back({{"file", f}, {"row_offset", p["row_offset"]}, {"rows", p["rows"]}});
      digests[it.key()].add(RowDigest{p["lo"].get<int64_t>(), p["hi"].get<int64_t>(), DigestKind::Xxh3});
    }
    fs::remove(js);
  }
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    json& e = it.value();
    std::vector<Piece> ps = pieces_of(e, it.key());
    std::sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    int64_t next = 0;
    for (const Piece& p : ps) {
      if (p.offset != next)
        throw Error("checkpoint " + dir + ": the ranks' rows of '" + it.key() + "' leave a gap or overlap (a bug)");
      next += p.rows;
    }
    const std::vector<int64_t> shape = json_shape(e["shape"], it.key());
    if (next != rows_of(shape))
      throw Error("checkpoint " + dir + ": '" + it.key() + "' has " + std::to_string(next) + " of " +
                  std::to_string(rows_of(shape)) + " rows (a bug)");
    e["digest"] = digests[it.key()].hex();
  }
  return json{{"format", "fsdpx-sharded"}, {"version", 1},        {"step", step},
              {"world_size", world_size},  {"tensors", tensors}, {"files", files}};
}

// Free bytes on the filesystem holding `path`, for the message of a write that failed there.
std::string free_space(const fs::path& path) {
  std::error_code ec;
  const fs::space_info sp = fs::space(path, ec);
  if (ec) return "free space unknown (" + ec.message() + ")";
  char b[64];
  std::snprintf(b, sizeof b, "%.1f MB free", static_cast<double>(sp.available) / 1e6);
  return b;
}

// One sharded save in its parts (CheckpointWriter): this rank's rows as rank-RRRRR.safetensors
// in the temporary directory, taken a buffer at a time, and rank-RRRRR.json listing its pieces
// with their partial digests (for rank 0 to assemble the index).
class ShardedWriter final : public CheckpointWriter {
 public:
  ShardedWriter(const std::string& dir, const CheckpointState& layout, const CheckpointContext& ctx)
      : dir_(dir), rank_(ctx.rank), world_size_(ctx.world_size), step_(layout.step),
        trainer_state_(layout.trainer_state_json), config_(layout.config_ini) {
    const fs::path final_dir(dir);
    tmp_ = final_dir.parent_path() / (".tmp-" + final_dir.filename().string());
    for (const auto& t : layout.tensors) {
      Part p;
      p.name = t.name;
      p.dtype = t.local.scalar_type();
      p.shape = t.global_shape;
      p.row_offset = t.row_offset;
      p.rows = rows_of(t.local);
      p.owned = owns(t, ctx);
      p.row_bytes = row_bytes_of(t.global_shape, p.dtype);
      parts_.push_back(std::move(p));
    }
  }

  bool writes(size_t i) const override { return i < parts_.size() && parts_[i].owned; }

  void write_rows(size_t i, const void* bytes, int64_t rows) override {
    if (!writes(i)) throw Error("checkpoint " + dir_ + ": rank " + std::to_string(rank_) + " does not write tensor " +
                                std::to_string(i) + " (a bug)");
    if (!file_) open_file();
    Part& p = parts_[i];
    if (rows < 0 || p.done + rows > p.rows)
      throw Error("checkpoint " + dir_ + ": rows of '" + p.name + "' written past its " + std::to_string(p.rows) +
                  " (a bug)");
    if (fault_requested("save-disk-full", rank_)) throw write_error(std::strerror(ENOSPC));
    try {
      file_->write_part(bytes, rows * p.row_bytes);
    } catch (const Error& e) {
      throw write_error(e.what());
    }
    p.digest.add_rows(static_cast<const char*>(bytes), p.row_offset + p.done, rows, p.row_bytes);
    p.done += rows;
    if (++parts_written_ == 2) maybe_fault("save-during-write", rank_);  // its file half there
  }

  void finish(const CheckpointContext& ctx, const std::string& error) override {
    agree(ctx, "writing checkpoint " + dir_, [&] {
      if (!error.empty()) throw Error(error);
      close_file();
      maybe_fault("save-after-write", rank_);
    });
    agree(ctx, "completing checkpoint " + dir_, [&] {
      if (rank_ != 0) return;
      write_text(tmp_ / "index.json", assemble_index(dir_, tmp_, step_, world_size_).dump(1));
      write_text(tmp_ / "trainer_state.json", trainer_state_);
      write_text(tmp_ / "config.ini", config_);
      fsync_directory(tmp_.string());
      swap_into_place(tmp_, fs::path(dir_));
    });
  }

 private:
  struct Part {
    std::string name;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    std::vector<int64_t> shape;  // global
    int64_t row_offset = 0, rows = 0;
    bool owned = false;
    int64_t row_bytes = 0, done = 0;
    RowDigest digest;
  };

  std::string file_name() const { return rank_file("rank-%05d.safetensors", rank_); }

  void open_file() {
    std::vector<SafetensorsWriter::Spec> specs;
    for (const Part& p : parts_) {
      if (!p.owned) continue;
      std::vector<int64_t> shape = p.shape;
      if (!shape.empty()) shape[0] = p.rows;
      specs.push_back({p.name, p.dtype, shape});
    }
    // PyTorch's DCP reads the folder's safetensors files through HuggingFaceStorageReader: each
    // tensor of a file is a chunk at its saved_offsets (this rank's first row, 0 in every other
    // dimension) of a tensor as large as its chunks reach.
    json sharding = json::object();
    for (const Part& p : parts_) {
      if (!p.owned) continue;
      std::vector<int64_t> offsets(p.shape.size(), 0);
      if (!offsets.empty()) offsets[0] = p.row_offset;
      sharding[p.name] = {{"saved_offsets", offsets}};
    }
    try {
      const std::map<std::string, std::string> meta{
          {"format", "fsdpx-sharded-piece"}, {"DCP_SHARDING_INFO", sharding.dump()}, {"DCP_VERSION", "1.0"}};
      file_ = std::make_unique<SafetensorsWriter>((tmp_ / file_name()).string(), specs, meta);
    } catch (const Error& e) {
      throw write_error(e.what());
    }
  }

  // This rank's file fsynced (every owned row written), and its piece list beside it.
  void close_file() {
    json pieces = json::object();
    bool any = false;
    for (const Part& p : parts_) {
      if (!p.owned) continue;
      any = true;
      if (p.done != p.rows)
        throw Error("checkpoint " + dir_ + ": " + std::to_string(p.done) + " of " + std::to_string(p.rows) +
                    " rows of '" + p.name + "' written (a bug)");
      pieces[p.name] = {{"dtype", safetensors_dtype(p.dtype)}, {"shape", p.shape}, {"row_offset", p.row_offset},
                        {"rows", p.rows}, {"lo", p.digest.lo}, {"hi", p.digest.hi}};
    }
    if (any && !file_) open_file();  // every owned tensor had zero rows
    try {
      if (file_) file_->close();
      const json list{{"file", any ? file_name() : ""}, {"pieces", pieces}};
      write_text(tmp_ / rank_file("rank-%05d.json", rank_), list.dump());
    } catch (const Error& e) {
      throw write_error(e.what());
    }
  }

  // A failed write: the checkpoint, the rank, why, and the free space where it was writing.
  Error write_error(const std::string& why) const {
    return Error("checkpoint " + dir_ + ": rank " + std::to_string(rank_) + " could not write its shards: " + why +
                 " (" + free_space(tmp_.parent_path()) + " on " + tmp_.parent_path().string() +
                 "); the previous checkpoints are intact");
  }

  const std::string dir_;
  fs::path tmp_;
  const int rank_, world_size_;
  const int64_t step_;
  const std::string trainer_state_, config_;
  std::vector<Part> parts_;
  std::unique_ptr<SafetensorsWriter> file_;
  int parts_written_ = 0;
};

}  // namespace

std::unique_ptr<CheckpointWriter> begin_sharded_save(const std::string& dir, const CheckpointState& layout,
                                                     const CheckpointContext& ctx) {
  const fs::path final_dir(dir), root = final_dir.parent_path();
  const fs::path tmp = root / (".tmp-" + final_dir.filename().string());
  agree(ctx, "preparing checkpoint " + dir, [&] {
    if (ctx.rank == 0) {
      fs::create_directories(root);
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    }
  });
  return std::make_unique<ShardedWriter>(dir, layout, ctx);
}

void save_sharded(const std::string& dir, const CheckpointState& st, const CheckpointContext& ctx) {
  std::unique_ptr<CheckpointWriter> w = begin_sharded_save(dir, st, ctx);
  std::string error;
  try {
    for (size_t i = 0; i < st.tensors.size(); ++i) {
      if (!w->writes(i)) continue;
      const at::Tensor c = st.tensors[i].local.contiguous();
      w->write_rows(i, c.data_ptr(), rows_of(c));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  w->finish(ctx, error);
}

void load_sharded(const std::string& dir, CheckpointState& st, const CheckpointContext& ctx) {
  std::vector<RowDigest> digests(st.tensors.size());
  Index ix;
  agree(ctx, "loading checkpoint " + dir, [&] {
    at::NoGradGuard no_grad;
    ix = read_index(dir);
    if (const std::string why = checkpoint_problem(dir); !why.empty())
      throw Error("checkpoint " + dir + " is not complete: " + why);
    st.step = ix.j.value("step", int64_t{0});
    st.trainer_state_json =
        fs::exists(fs::path(dir) / "trainer_state.json") ? read_text(fs::path(dir) / "trainer_state.json") : "";
    st.config_ini = fs::exists(fs::path(dir) / "config.ini") ? read_text(fs::path(dir) / "config.ini") : "";
    Files files(dir, ix.j.value("files", json::object()));
    for (size_t i = 0; i < st.tensors.size(); ++i) {
      TensorShard& t = st.tensors[i];
      const json& tensors = ix.j["tensors"];
      if (!tensors.contains(t.name)) {
        std::vector<std::string> held;
        for (const auto& [name, _] : tensors.items()) held.push_back(name);
        throw Error("checkpoint " + dir + " has no tensor '" + t.name + "'" + dcp_names_tried(ix, t.name) +
                    missing_tensor_question(t.name, held) +
                    "model, optimizer or precision? (fsdpx-ckpt inspect lists what it holds)");
      }
      const json& e = tensors[t.name];
      digests[i].kind = RowDigest::kind_of(e.value("digest", ""));
      const std::string where = "checkpoint " + dir + ": tensor '" + t.name + "'";
      const std::vector<int64_t> shape = json_shape(e.value("shape", json()), where);
      if (shape != t.global_shape)
        throw Error(where + " has shape " + shape_text(shape) + " in the checkpoint, the run's is " +
                    shape_text(t.global_shape));
      c10::ScalarType saved;
      try {
        saved = dtype_from_safetensors(e.value("dtype", ""));
      } catch (const Error& err) {
        throw Error(where + ": " + err.what());
      }
      const int64_t n = rows_of(t.local);
      if (n == 0) continue;
      at::Tensor into = receiving_tensor(t.local, saved);
      read_tensor_rows_into(files, t.name, e, shape, saved, t.row_offset, n, static_cast<char*>(into.data_ptr()),
                            owns(t, ctx) ? &digests[i] : nullptr);
      finish_load(t.local, into);
    }
  }, &digests);
  // DCP records no digests (its folder's sizes and coverage were checked as its index was made).
  const std::string missing = ix.j.value("written_by", "") == "dcp" ? "" : "?";
  check_digests(dir, st, digests,
                [&](const std::string& name) { return ix.j["tensors"][name].value("digest", missing); }, "the index",
                "a shard file is corrupted");
}

}  // namespace fsdpx
