// The sharded format: every rank writes its rows; an index makes the checkpoint loadable at any
// world size and strategy (checkpointing.h describes the files).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "format_support.h"

namespace fs = std::filesystem;

namespace fsdpx {

using namespace ckpt;

namespace {

std::string rank_file(const char* pattern, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, pattern, rank);
  return name;
}

// This rank's rows as rank-RRRRR.safetensors in `tmp`, and rank-RRRRR.json listing its pieces
// with their partial digests (for rank 0 to assemble the index).
void write_rank_piece(const fs::path& tmp, const CheckpointState& st, const CheckpointContext& ctx) {
  const std::string file = rank_file("rank-%05d.safetensors", ctx.rank);
  std::vector<SafetensorsWriter::Spec> specs;
  std::vector<const TensorShard*> mine;
  json pieces = json::object();
  for (const auto& t : st.tensors) {
    if (!owns(t, ctx)) continue;
    std::vector<int64_t> shape = t.global_shape;
    if (!shape.empty()) shape[0] = rows_of(t.local);
    specs.push_back({t.name, t.local.scalar_type(), shape});
    mine.push_back(&t);
  }
  if (!mine.empty()) {
    SafetensorsWriter w((tmp / file).string(), specs, {{"format", "fsdpx-sharded-piece"}});
    for (size_t k = 0; k < mine.size(); ++k) {
      const TensorShard* t = mine[k];
      at::Tensor c = t->local.contiguous();
      w.write(c.reshape(specs[k].shape));
      RowDigest d;
      d.add_rows(static_cast<const char*>(c.data_ptr()), t->row_offset, rows_of(t->local),
                 row_bytes_of(t->global_shape, c.scalar_type()));
      pieces[t->name] = {{"dtype", safetensors_dtype(c.scalar_type())}, {"shape", t->global_shape},
                         {"row_offset", t->row_offset}, {"rows", rows_of(t->local)}, {"lo", d.lo}, {"hi", d.hi}};
    }
    w.close();
  }
  write_text(tmp / rank_file("rank-%05d.json", ctx.rank),
             json{{"file", mine.empty() ? "" : file}, {"pieces", pieces}}.dump());
}

// Rank 0: the index's tensors and files from every rank's piece list (which it removes), each
// tensor's rows checked to be covered exactly once and its digest summed.
json assemble_index(const std::string& dir, const fs::path& tmp, const CheckpointState& st, int world_size) {
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
  return json{{"format", "fsdpx-sharded"}, {"version", 1},        {"step", st.step},
              {"world_size", world_size},  {"tensors", tensors}, {"files", files}};
}

}  // namespace

void save_sharded(const std::string& dir, const CheckpointState& st, const CheckpointContext& ctx) {
  const fs::path final_dir(dir), root = final_dir.parent_path();
  const fs::path tmp = root / (".tmp-" + final_dir.filename().string());
  agree(ctx, "preparing checkpoint " + dir, [&] {
    if (ctx.rank == 0) {
      fs::create_directories(root);
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    }
  });
  agree(ctx, "writing checkpoint " + dir, [&] {
    write_rank_piece(tmp, st, ctx);
    maybe_fault("save-after-write", ctx.rank);
  });
  agree(ctx, "completing checkpoint " + dir, [&] {
    if (ctx.rank != 0) return;
    write_text(tmp / "index.json", assemble_index(dir, tmp, st, ctx.world_size).dump(1));
    write_text(tmp / "trainer_state.json", st.trainer_state_json);
    write_text(tmp / "config.ini", st.config_ini);
    fsync_directory(tmp.string());
    swap_into_place(tmp, final_dir);
  });
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
      if (!tensors.contains(t.name))
        throw Error(
            "checkpoint " + dir + " has no tensor '" + t.name +
            "'; was it saved from another model, optimizer or precision? (fsdpx-ckpt inspect lists what it holds)");
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
  check_digests(dir, st, digests, [&](const std::string& name) { return ix.j["tensors"][name].value("digest", "?"); },
                "the index", "a shard file is corrupted");
}

}  // namespace fsdpx
