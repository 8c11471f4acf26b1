// The consolidated format: one safetensors file of whole tensors, written by rank 0.
#include <algorithm>
#include <cstring>
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
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "fsdpx/suggest.h"
#include "checkpoint_files.h"
#include "checkpoint_tensors.h"
#include "dcp_index.h"
#include "rank_agreement.h"

namespace fs = std::filesystem;

namespace fsdpx {

using namespace ckpt;

void save_consolidated(const std::string& dir, const CheckpointState& st, const CheckpointContext& ctx,
                       bool with_optimizer) {
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
      w = std::make_unique<SafetensorsWriter>(
          (tmp / "model.safetensors").string(), specs,
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
        d.add_rows(static_cast<const char*>(c.data_ptr()), 0, rows_of(t->global_shape),
                   row_bytes_of(t->global_shape, c.scalar_type()));
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
    if (!fs::exists(p)) throw Error(dir + " does not exist; give a checkpoint directory (step-NNNNNNNN)");
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
        std::vector<std::string> held;
        for (const auto& [name, _] : r.entries()) held.push_back(name);
        throw Error(p.string() + " has no tensor '" + t.name + "'" + missing_tensor_question(t.name, held) + "model?");
      }
      const SafetensorsEntry& e = r.entry(t.name);
      if (want.contains(t.name) && want[t.name].is_string())
        digests[i].kind = RowDigest::kind_of(want[t.name].get<std::string>());
      if (e.shape != t.global_shape)
        throw Error(p.string() + ": tensor '" + t.name + "' has shape " + shape_text(e.shape) + ", the run's is " +
                    shape_text(t.global_shape));
      const int64_t n = rows_of(t.local);
      if (n == 0) continue;
      at::Tensor into = receiving_tensor(t.local, e.scalar_type);
      char* bytes = static_cast<char*>(into.data_ptr());
      r.read_rows_into(t.name, t.row_offset, n, bytes);
      if (owns(t, ctx)) digests[i].add_rows(bytes, t.row_offset, n, e.row_bytes());
      finish_load(t.local, into);
    }
  }, &digests);
  check_digests(dir, st, digests,
                [&](const std::string& name) {
                  return want.contains(name) && want[name].is_string() ? want[name].get<std::string>() : std::string();
                },
                "digests.json", "the file is corrupted");
}

void load_initial_weights(const std::string& path, CheckpointState& st, const CheckpointContext& ctx) {
  fs::path p(path);
  // A folder PyTorch's DCP wrote (HuggingFaceStorageWriter, or FileSystemWriter as safetensors):
  // each rank reads its rows of every parameter; other tensors there (an optimizer's) stay unread.
  if (fs::is_directory(p) && !fs::exists(p / "model.safetensors") && ckpt::is_dcp_folder(path))
    return load_sharded(path, st, ctx);
  if (fs::is_directory(p)) p /= "model.safetensors";
  std::string error;
  try {
    if (!fs::is_regular_file(p))
      throw Error("--init-from " + path +
                  ": no such file; give a safetensors file, or a directory holding model.safetensors "
                  "(a consolidated checkpoint, or what --save-init wrote)");
    std::set<std::string> wanted;
    for (const TensorShard& t : st.tensors) wanted.insert(t.name);
    const SafetensorsReader file(p.string());
    for (const auto& [name, entry] : file.entries())
      if (name.rfind(kOptimPrefix, 0) != 0 && !wanted.count(name))
        throw Error("--init-from " + p.string() + ": the file holds tensor '" + name +
                    "', which is not a parameter of this "
                    "model" +
                    did_you_mean(name, std::vector<std::string>(wanted.begin(), wanted.end())) +
                    " (was it saved from another model or size?)");
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::vector<int64_t> failed{error.empty() ? 0 : 1};
  ctx.all_sum(failed);  // every rank stops together: the file may look different from another rank
  if (failed[0] > 0) throw Error(error.empty() ? "--init-from " + path + ": another rank could not read it" : error);
  load_consolidated(p.string(), st, ctx);
}

}  // namespace fsdpx
