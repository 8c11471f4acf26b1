#include "fsdpx/framework/checkpointing.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/process_groups.h"
#include "fsdpx/framework/safetensors.h"
#include "fsdpx/framework/sharding_engine.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace fsdpx {

namespace {

constexpr const char* kOptimPrefix = "optim/";

int64_t rows_of(const at::Tensor& local) { return local.dim() == 0 ? 1 : local.size(0); }
int64_t rows_of(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape[0]; }
int64_t row_bytes_of(const std::vector<int64_t>& shape, c10::ScalarType t) {
  int64_t n = static_cast<int64_t>(c10::elementSize(t));
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
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
// the process dies in between, list_checkpoints moves it back.
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
           std::vector<RowDigest>* digests = nullptr) {
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
    if (sums[static_cast<size_t>(r)]) throw Error(what + " failed on rank " + std::to_string(r) + " (its log says why)");
  if (digests)
    for (size_t i = 0; i < digests->size(); ++i) {
      const size_t at = static_cast<size_t>(ctx.world_size) + 2 * i;
      (*digests)[i] = RowDigest{sums[at], sums[at + 1]};
    }
}

// After a load: every tensor's digest, summed over the ranks, against the one the checkpoint
// recorded (`recorded` gives it, "" when it has none).
void check_digests(const std::string& dir, const CheckpointState& st, const std::vector<RowDigest>& digests,
                   const std::function<std::string(const std::string&)>& recorded, const char* source, const char* damage) {
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    const std::string& name = st.tensors[i].name;
    const std::string want = recorded(name);
    if (want.empty()) continue;
    const std::string got = digests[i].hex();
    if (got != want)
      throw Error("checkpoint " + dir + ": tensor '" + name + "' does not match its digest (" + got + ", " + source + " says " +
                  want + "): " + damage);
  }
}

at::Tensor bytes_to_tensor(std::vector<char>& bytes, const std::vector<int64_t>& shape, int64_t rows, c10::ScalarType t) {
  std::vector<int64_t> s = shape.empty() ? std::vector<int64_t>{} : shape;
  if (!s.empty()) s[0] = rows;
  return at::from_blob(bytes.data(), s, at::TensorOptions().dtype(t)).clone();
}

std::string shape_text(const std::vector<int64_t>& s) { return c10::str(at::IntArrayRef(s)); }

struct Index {
  json j;
  fs::path dir;
};

Index read_index(const std::string& dir) {
  const fs::path p = fs::path(dir) / "index.json";
  if (!fs::exists(p)) {
    if (fs::exists(fs::path(dir) / "model.safetensors"))
      throw Error(dir + " is a consolidated checkpoint (model.safetensors), not a sharded one (fsdpx-train loads it with "
                  "--checkpoint.name consolidated; it is already one file, nothing to consolidate)");
    throw Error(dir + " is not a checkpoint: it has no index.json (an interrupted save leaves only a .tmp- directory)");
  }
  Index ix{json(), dir};
  try {
    ix.j = json::parse(read_text(p));
  } catch (const json::exception& e) {
    throw Error(p.string() + ": not valid JSON (" + e.what() + ")");
  }
  if (!ix.j.is_object() || ix.j.value("format", "") != "fsdpx-sharded" || !ix.j.contains("tensors") ||
      !ix.j["tensors"].is_object())
    throw Error(p.string() + ": not an fsdpx sharded checkpoint index");
  if (ix.j.value("version", 0) != 1)
    throw Error(p.string() + ": format version " + std::to_string(ix.j.value("version", 0)) + ", this fsdpx reads version 1");
  return ix;
}

std::vector<int64_t> json_shape(const json& j, const std::string& where) {
  if (!j.is_array()) throw Error(where + ": shape is not a list");
  std::vector<int64_t> s;
  for (const auto& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) throw Error(where + ": shape " + j.dump() + " is not a list of sizes");
    s.push_back(d.get<int64_t>());
  }
  return s;
}

// Readers opened once per file, with the index's recorded size checked first.
class Files {
 public:
  Files(fs::path dir, const json& sizes) : dir_(std::move(dir)), sizes_(sizes) {}
  SafetensorsReader& get(const std::string& file) {
    auto it = open_.find(file);
    if (it != open_.end()) return *it->second;
    if (file.find('/') != std::string::npos || file.find("..") != std::string::npos)
      throw Error((dir_ / "index.json").string() + ": file name '" + file + "' leaves the checkpoint directory");
    const fs::path p = dir_ / file;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec) throw Error(p.string() + ": missing (" + ec.message() + ")");
    if (sizes_.contains(file) && sizes_[file].is_number_integer() && static_cast<int64_t>(size) != sizes_[file].get<int64_t>())
      throw Error(p.string() + ": " + std::to_string(size) + " bytes, the index records " +
                  std::to_string(sizes_[file].get<int64_t>()) + " (truncated or replaced)");
    return *open_.emplace(file, std::make_unique<SafetensorsReader>(p.string())).first->second;
  }

 private:
  fs::path dir_;
  json sizes_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> open_;
};

struct Piece {
  std::string file;
  int64_t offset, rows;
};

std::vector<Piece> pieces_of(const json& entry, const std::string& where) {
  std::vector<Piece> out;
  if (!entry.contains("pieces") || !entry["pieces"].is_array()) throw Error(where + ": no pieces");
  for (const auto& p : entry["pieces"]) {
    if (!p.is_object() || !p.contains("file") || !p.contains("row_offset") || !p.contains("rows") || !p["file"].is_string() ||
        !p["row_offset"].is_number_integer() || !p["rows"].is_number_integer())
      throw Error(where + ": a piece lacks file, row_offset or rows");
    out.push_back({p["file"].get<std::string>(), p["row_offset"].get<int64_t>(), p["rows"].get<int64_t>()});
  }
  return out;
}

// Reads rows [first, first + count) of tensor `name` from its pieces, checking each piece's
// header against the index. Adds the bytes to `digest` when `count_digest`.
std::vector<char> read_tensor_rows(Files& files, const std::string& name, const json& entry, const std::vector<int64_t>& shape,
                                   c10::ScalarType dtype, int64_t first, int64_t count, RowDigest* digest) {
  const std::string where = "tensor '" + name + "'";
  const int64_t rb = row_bytes_of(shape, dtype);
  std::vector<char> out(static_cast<size_t>(count * rb));
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
    std::vector<char> bytes = r.read_rows(name, lo - p.offset, hi - lo);
    if (digest) digest->add_rows(bytes.data(), lo, hi - lo, rb);
    std::memcpy(out.data() + (lo - first) * rb, bytes.data(), bytes.size());
    covered += hi - lo;
  }
  if (covered != count)
    throw Error(where + ": the checkpoint's pieces cover " + std::to_string(covered) + " of rows " + std::to_string(first) + ".." +
                std::to_string(first + count) + " (the index is damaged)");
  return out;
}

}  // namespace

// --- The trainer's side ---------------------------------------------------------------------

CheckpointState checkpoint_state(const ShardingEngine& engine, const Optimizer& optimizer, bool for_load) {
  at::NoGradGuard no_grad;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& u : engine.plan().units)
    for (size_t i = 0; i < u.names.size(); ++i) shapes[u.names[i]] = u.shapes[i];
  CheckpointState st;
  const int sr = engine.shard_rank();
  for (const ParamShard& p : engine.shards()) {
    auto it = shapes.find(p.name);
    if (it == shapes.end()) throw Error("checkpoint: parameter '" + p.name + "' is not in the engine's plan (a bug)");
    const std::vector<int64_t>& shape = it->second;
    const int64_t d0 = rows_of(shape), rps = rows_of(p.param);
    const int64_t offset = sr * rps, valid = std::clamp<int64_t>(d0 - offset, 0, rps);
    at::Tensor param = p.param.detach();
    at::Tensor local = shape.empty() ? (sr == 0 ? param.reshape({}) : param.narrow(0, 0, 0)) : param.narrow(0, 0, valid);
    st.tensors.push_back({p.name, local, shape, offset});
    if (!p.param.requires_grad()) continue;  // frozen: no optimizer state
    for (const auto& [key, t] : optimizer.state(p.name)) {
      at::Tensor c = for_load ? t.detach().clone() : t.detach();
      if (t.dim() > 0 && t.size(0) == rps && !shape.empty()) {
        std::vector<int64_t> g = t.sizes().vec();
        g[0] = d0;
        st.tensors.push_back({kOptimPrefix + p.name + "/" + key, c.narrow(0, 0, valid), g, offset});
      } else {
        st.tensors.push_back({kOptimPrefix + p.name + "/" + key, c, t.sizes().vec(), 0});
      }
    }
  }
  return st;
}

CheckpointContext checkpoint_context(const ProcessGroups& groups, const ShardingEngine& engine) {
  auto world = groups.world();
  CheckpointContext ctx;
  ctx.rank = world->rank();
  ctx.world_size = world->size();
  ctx.primary = engine.replicate_rank() == 0;
  ctx.barrier = [world] { world->barrier().wait(); };
  ctx.all_sum = [world](std::vector<int64_t>& v) {
    if (world->size() == 1 || v.empty()) return;
    at::Tensor t = at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kLong).clone();
    world->all_reduce(t, ReduceOp::Sum).wait();
    std::memcpy(v.data(), t.data_ptr<int64_t>(), v.size() * sizeof(int64_t));
  };
  ctx.gather_to_rank0 = [world](const TensorShard& s) -> at::Tensor {
    const int W = world->size();
    at::Tensor local = s.local.contiguous();
    const std::vector<int64_t>& shape = s.global_shape;
    if (W == 1) return local.reshape(shape).clone();
    // Every rank's (offset, rows), then the rows padded to the largest share.
    at::Tensor meta = at::empty({2}, at::kLong);
    meta[0] = s.row_offset;
    meta[1] = rows_of(local);
    at::Tensor metas = at::empty({2 * W}, at::kLong);
    world->all_gather(metas, meta).wait();
    int64_t most = 0;
    for (int r = 0; r < W; ++r) most = std::max(most, metas[2 * r + 1].item<int64_t>());
    const int64_t row = row_bytes_of(shape, local.scalar_type()) / static_cast<int64_t>(local.element_size());
    at::Tensor mine = at::zeros({most * row}, local.options());
    if (local.numel() > 0) mine.narrow(0, 0, local.numel()).copy_(local.reshape({-1}));
    at::Tensor all = at::empty({W * most * row}, local.options());
    world->all_gather(all, mine).wait();
    if (world->rank() != 0) return at::Tensor();
    at::Tensor full = at::empty({rows_of(shape) * row}, local.options());
    for (int r = 0; r < W; ++r) {
      const int64_t off = metas[2 * r].item<int64_t>(), n = metas[2 * r + 1].item<int64_t>();
      if (n > 0) full.narrow(0, off * row, n * row).copy_(all.narrow(0, r * most * row, n * row));
    }
    return full.reshape(shape);
  };
  return ctx;
}

void apply_checkpoint(const CheckpointState& st, Optimizer& optimizer, DataSource& data) {
  at::NoGradGuard no_grad;
  std::map<std::string, std::vector<const TensorShard*>> by_param;
  for (const auto& t : st.tensors)
    if (t.name.rfind(kOptimPrefix, 0) == 0) {
      const std::string rest = t.name.substr(std::strlen(kOptimPrefix));
      by_param[rest.substr(0, rest.rfind('/'))].push_back(&t);
    }
  for (const auto& [param, tensors] : by_param) {
    ShardState current = optimizer.state(param), updated;
    for (const auto& [key, t] : current) {
      const std::string name = kOptimPrefix + param + "/" + key;
      auto it = std::find_if(tensors.begin(), tensors.end(), [&](const TensorShard* s) { return s->name == name; });
      if (it == tensors.end()) throw Error("checkpoint: optimizer state '" + name + "' was not loaded");
      at::Tensor fresh = t.detach().clone();
      const at::Tensor& loaded = (*it)->local;
      if (loaded.dim() > 0 && fresh.dim() > 0 && loaded.size(0) <= fresh.size(0) && loaded.sizes() != fresh.sizes())
        fresh.narrow(0, 0, loaded.size(0)).copy_(loaded);
      else
        fresh.copy_(loaded.reshape(fresh.sizes()));
      updated.emplace_back(key, fresh);
    }
    optimizer.load_state(param, updated);
  }
  if (!st.trainer_state_json.empty()) {
    json j;
    try {
      j = json::parse(st.trainer_state_json);
    } catch (const json::exception& e) {
      throw Error(std::string("checkpoint: trainer state is not valid JSON (") + e.what() + ")");
    }
    if (j.contains("data")) data.restore(j["data"].dump());
  }
}

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (root.empty() || !fs::is_directory(root, ec)) return out;
  // A save that died between moving the old checkpoint aside and removing it: move it back.
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".old-step-", 0) == 0 && !fs::exists(fs::path(root) / name.substr(5))) {
      std::error_code rec;
      fs::rename(e.path(), fs::path(root) / name.substr(5), rec);
    }
  }
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !e.is_directory()) continue;
    char* end = nullptr;
    const long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (*end != '\0') continue;
    // Complete: an index (sharded) or digests (consolidated) that parses.
    for (const char* marker : {"index.json", "digests.json"}) {
      const fs::path m = e.path() / marker;
      if (!fs::exists(m)) continue;
      try {
        if (json::parse(read_text(m)).is_object()) out.emplace_back(step, e.path().string());
      } catch (const std::exception&) {
      }
      break;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  auto all = list_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

void prune_checkpoints(const std::string& root, int64_t keep) {
  auto all = list_checkpoints(root);
  std::error_code ec;
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove_all(all[i].second, ec);
  // Temporary directories of saves that never completed (the current save is done by now).
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.path().filename().string().rfind(".tmp-step-", 0) == 0) fs::remove_all(e.path(), ec);
}

void maybe_fault(const char* point, int rank) {
  const char* f = std::getenv("FSDPX_FAULT");
  if (!f) return;
  const std::string want = std::string(point) + ":" + std::to_string(rank);
  if (want == f) {
    std::fprintf(stderr, "fsdpx: FSDPX_FAULT=%s: rank %d exits abruptly\n", f, rank);
    std::fflush(stderr);
    ::_exit(9);
  }
}

// --- Sharded ----------------------------------------------------------------------------------

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
  char file[32];
  std::snprintf(file, sizeof file, "rank-%05d.safetensors", ctx.rank);
  agree(ctx, "writing checkpoint " + dir, [&] {
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
    char js[32];
    std::snprintf(js, sizeof js, "rank-%05d.json", ctx.rank);
    write_text(tmp / js, json{{"file", mine.empty() ? "" : file}, {"pieces", pieces}}.dump());
    maybe_fault("save-after-write", ctx.rank);
  });
  agree(ctx, "completing checkpoint " + dir, [&] {
    if (ctx.rank != 0) return;
    json tensors = json::object(), files = json::object();
    std::map<std::string, RowDigest> digests;
    for (int r = 0; r < ctx.world_size; ++r) {
      char js[32];
      std::snprintf(js, sizeof js, "rank-%05d.json", r);
      json part = json::parse(read_text(tmp / js));
      const std::string f = part["file"].get<std::string>();
      if (!f.empty()) files[f] = static_cast<int64_t>(fs::file_size(tmp / f));
      for (auto it = part["pieces"].begin(); it != part["pieces"].end(); ++it) {
        const json& p = it.value();
        json& e = tensors[it.key()];
        if (e.is_null()) e = {{"dtype", p["dtype"]}, {"shape", p["shape"]}, {"pieces", json::array()}};
        if (e["dtype"] != p["dtype"] || e["shape"] != p["shape"])
          throw Error("checkpoint " + dir + ": ranks disagree on the dtype or shape of '" + it.key() + "'");
        e["pieces"].push_back({{"file", f}, {"row_offset", p["row_offset"]}, {"rows", p["rows"]}});
        digests[it.key()].add(RowDigest{p["lo"].get<int64_t>(), p["hi"].get<int64_t>()});
      }
      fs::remove(tmp / js);
    }
    for (auto it = tensors.begin(); it != tensors.end(); ++it) {
      json& e = it.value();
      std::vector<Piece> ps = pieces_of(e, it.key());
      std::sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
      int64_t next = 0;
      for (const Piece& p : ps) {
        if (p.offset != next) throw Error("checkpoint " + dir + ": the ranks' rows of '" + it.key() + "' leave a gap or overlap (a bug)");
        next += p.rows;
      }
      const std::vector<int64_t> shape = json_shape(e["shape"], it.key());
      if (next != rows_of(shape)) throw Error("checkpoint " + dir + ": '" + it.key() + "' has " + std::to_string(next) + " of " +
                                              std::to_string(rows_of(shape)) + " rows (a bug)");
      e["digest"] = digests[it.key()].hex();
    }
    json index{{"format", "fsdpx-sharded"}, {"version", 1},        {"step", st.step},
               {"world_size", ctx.world_size}, {"tensors", tensors}, {"files", files}};
    write_text(tmp / "index.json", index.dump(1));
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
    st.step = ix.j.value("step", int64_t{0});
    st.trainer_state_json = fs::exists(fs::path(dir) / "trainer_state.json") ? read_text(fs::path(dir) / "trainer_state.json") : "";
    st.config_ini = fs::exists(fs::path(dir) / "config.ini") ? read_text(fs::path(dir) / "config.ini") : "";
    Files files(dir, ix.j.value("files", json::object()));
    for (size_t i = 0; i < st.tensors.size(); ++i) {
      TensorShard& t = st.tensors[i];
      const json& tensors = ix.j["tensors"];
      if (!tensors.contains(t.name))
        throw Error("checkpoint " + dir + " has no tensor '" + t.name +
                    "'; was it saved from another model, optimizer or precision? (fsdpx-ckpt inspect lists what it holds)");
      const json& e = tensors[t.name];
      const std::string where = "checkpoint " + dir + ": tensor '" + t.name + "'";
      const std::vector<int64_t> shape = json_shape(e.value("shape", json()), where);
      if (shape != t.global_shape)
        throw Error(where + " has shape " + shape_text(shape) + " in the checkpoint, the run's is " + shape_text(t.global_shape));
      c10::ScalarType saved;
      try {
        saved = dtype_from_safetensors(e.value("dtype", ""));
      } catch (const Error& err) {
        throw Error(where + ": " + err.what());
      }
      const int64_t n = rows_of(t.local);
      if (n == 0) continue;
      std::vector<char> bytes =
          read_tensor_rows(files, t.name, e, shape, saved, t.row_offset, n, owns(t, ctx) ? &digests[i] : nullptr);
      at::Tensor src = bytes_to_tensor(bytes, shape, n, saved);
      t.local.copy_(src.reshape(t.local.sizes()));  // casts when the run stores another dtype
    }
  }, &digests);
  check_digests(dir, st, digests, [&](const std::string& name) { return ix.j["tensors"][name].value("digest", "?"); },
                "the index", "a shard file is corrupted");
}

CheckpointInfo inspect_checkpoint(const std::string& path) {
  CheckpointInfo info;
  fs::path p(path);
  if (fs::is_directory(p) && fs::exists(p / "index.json")) {
    Index ix = read_index(path);
    info.format = "fsdpx-sharded";
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
  if (fs::is_directory(p)) p /= "model.safetensors";
  if (!fs::exists(p)) throw Error(path + " is not a checkpoint: no index.json (sharded) or model.safetensors (consolidated)");
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
    t.digest = digests.is_object() && digests.contains(name) && digests[name].is_string() ? digests[name].get<std::string>() : "";
    t.pieces.push_back({p.filename().string(), {0, e.rows()}});
    info.tensors.push_back(std::move(t));
  }
  return info;
}

int64_t verify_checkpoint(const std::string& path) {
  CheckpointInfo info = inspect_checkpoint(path);
  int64_t checked = 0;
  constexpr int64_t kChunk = 64 << 20;
  if (info.format == "fsdpx-sharded") {
    Index ix = read_index(path);
    Files files(path, ix.j.value("files", json::object()));
    for (const auto& t : info.tensors) {
      const json& e = ix.j["tensors"][t.name];
      const c10::ScalarType dt = dtype_from_safetensors(t.dtype);
      const int64_t rb = row_bytes_of(t.shape, dt), rows = rows_of(t.shape);
      const int64_t step = std::max<int64_t>(1, kChunk / std::max<int64_t>(rb, 1));
      RowDigest d;
      for (int64_t first = 0; first < rows; first += step)
        read_tensor_rows(files, t.name, e, t.shape, dt, first, std::min(step, rows - first), &d);
      if (d.hex() != t.digest)
        throw Error(path + ": tensor '" + t.name + "' does not match its digest (" + d.hex() + ", the index says " + t.digest +
                    "): a shard file is corrupted");
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
    for (int64_t first = 0; first < rows; first += step) {
      const int64_t n = std::min(step, rows - first);
      std::vector<char> bytes = r.read_rows(t.name, first, n);
      d.add_rows(bytes.data(), first, n, rb);
    }
    if (!t.digest.empty() && d.hex() != t.digest)
      throw Error(p.string() + ": tensor '" + t.name + "' does not match its digest (" + d.hex() + ", digests.json says " + t.digest + ")");
    ++checked;
  }
  return checked;
}

void consolidate_checkpoint(const std::string& dir, const std::string& out, bool with_optimizer) {
  Index ix = read_index(dir);
  Files files(dir, ix.j.value("files", json::object()));
  std::vector<SafetensorsWriter::Spec> specs;
  for (auto it = ix.j["tensors"].begin(); it != ix.j["tensors"].end(); ++it) {
    if (!with_optimizer && it.key().rfind(kOptimPrefix, 0) == 0) continue;
    specs.push_back({it.key(), dtype_from_safetensors(it.value().value("dtype", "")), json_shape(it.value()["shape"], it.key())});
  }
  std::map<std::string, std::string> meta{{"format", "fsdpx-consolidated"}, {"step", std::to_string(ix.j.value("step", 0))}};
  if (fs::exists(fs::path(dir) / "trainer_state.json")) meta["trainer_state"] = read_text(fs::path(dir) / "trainer_state.json");
  if (fs::exists(fs::path(dir) / "config.ini")) meta["config"] = read_text(fs::path(dir) / "config.ini");
  const std::string tmp = out + ".tmp";
  SafetensorsWriter w(tmp, specs, meta);
  for (const auto& s : specs) {
    const json& e = ix.j["tensors"][s.name];
    RowDigest d;
    std::vector<char> bytes = read_tensor_rows(files, s.name, e, s.shape, s.dtype, 0, rows_of(s.shape), &d);
    if (d.hex() != e.value("digest", ""))
      throw Error(dir + ": tensor '" + s.name + "' does not match its digest; not consolidating a corrupted checkpoint");
    w.write(bytes_to_tensor(bytes, s.shape, rows_of(s.shape), s.dtype).reshape(s.shape));
  }
  w.close();
  fs::rename(tmp, out);
}

// --- Consolidated -----------------------------------------------------------------------------

void save_consolidated(const std::string& dir, const CheckpointState& st, const CheckpointContext& ctx, bool with_optimizer) {
  const fs::path final_dir(dir), root = final_dir.parent_path();
  const fs::path tmp = root / (".tmp-" + final_dir.filename().string());
  agree(ctx, "preparing checkpoint " + dir, [&] {
    if (ctx.rank == 0) {
      fs::create_directories(root);
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    }
  });
  std::vector<const TensorShard*> chosen;
  std::vector<SafetensorsWriter::Spec> specs;
  for (const auto& t : st.tensors) {
    if (!with_optimizer && t.name.rfind(kOptimPrefix, 0) == 0) continue;
    chosen.push_back(&t);
    specs.push_back({t.name, t.local.scalar_type(), t.global_shape});
  }
  std::unique_ptr<SafetensorsWriter> w;
  std::string error;
  if (ctx.rank == 0) {
    try {
      w = std::make_unique<SafetensorsWriter>((tmp / "model.safetensors").string(), specs,
                                              std::map<std::string, std::string>{{"format", "fsdpx-consolidated"},
                                                                                 {"step", std::to_string(st.step)},
                                                                                 {"trainer_state", st.trainer_state_json},
                                                                                 {"config", st.config_ini}});
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  json digests = json::object();
  for (const TensorShard* t : chosen) {  // collective: every rank, every tensor, in order
    at::Tensor full = ctx.gather_to_rank0(*t);
    if (ctx.rank == 0 && error.empty()) {
      try {
        at::Tensor c = full.contiguous();
        RowDigest d;
        d.add_rows(static_cast<const char*>(c.data_ptr()), 0, rows_of(t->global_shape), row_bytes_of(t->global_shape, c.scalar_type()));
        digests[t->name] = d.hex();
        w->write(c);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  }
  agree(ctx, "writing checkpoint " + dir, [&] {
    if (!error.empty()) throw Error(error);
    if (ctx.rank != 0) return;
    w->close();
    write_text(tmp / "digests.json", digests.dump(1));
    fsync_directory(tmp.string());
    swap_into_place(tmp, final_dir);
  });
}

void load_consolidated(const std::string& dir, CheckpointState& st, const CheckpointContext& ctx) {
  std::vector<RowDigest> digests(st.tensors.size());
  json want;
  agree(ctx, "loading checkpoint " + dir, [&] {
    at::NoGradGuard no_grad;
    fs::path p(dir);
    if (fs::is_directory(p)) p /= "model.safetensors";
    if (!fs::exists(p)) {
      if (fs::exists(fs::path(dir) / "index.json"))
        throw Error(dir + " is a sharded checkpoint, not a consolidated one; use --checkpoint.name sharded");
      throw Error(dir + " is not a consolidated checkpoint: no model.safetensors");
    }
    SafetensorsReader r(p.string());
    const fs::path dj = p.parent_path() / "digests.json";
    want = fs::exists(dj) ? parse_json_file(dj) : json::object();
    if (!want.is_object()) throw Error(dj.string() + ": not an object of digests");
    auto m = r.metadata();
    st.step = m.count("step") ? parse_step(m["step"], p.string()) : 0;
    st.trainer_state_json = m.count("trainer_state") ? m["trainer_state"] : "";
    st.config_ini = m.count("config") ? m["config"] : "";
    for (size_t i = 0; i < st.tensors.size(); ++i) {
      TensorShard& t = st.tensors[i];
      if (!r.entries().count(t.name)) {
        if (t.name.rfind(kOptimPrefix, 0) == 0)
          throw Error(p.string() + " holds no optimizer state ('" + t.name + "'): it was saved with optimizer=false; "
                      "it can initialise a model but not resume training exactly");
        throw Error(p.string() + " has no tensor '" + t.name + "'; was it saved from another model?");
      }
      const SafetensorsEntry& e = r.entry(t.name);
      if (e.shape != t.global_shape)
        throw Error(p.string() + ": tensor '" + t.name + "' has shape " + shape_text(e.shape) + ", the run's is " + shape_text(t.global_shape));
      const int64_t n = rows_of(t.local);
      if (n == 0) continue;
      std::vector<char> bytes = r.read_rows(t.name, t.row_offset, n);
      if (owns(t, ctx)) digests[i].add_rows(bytes.data(), t.row_offset, n, e.row_bytes());
      t.local.copy_(bytes_to_tensor(bytes, e.shape, n, e.scalar_type).reshape(t.local.sizes()));
    }
  }, &digests);
  check_digests(dir, st, digests,
                [&](const std::string& name) {
                  return want.contains(name) && want[name].is_string() ? want[name].get<std::string>() : std::string();
                },
                "digests.json", "the file is corrupted");
}

}  // namespace fsdpx
