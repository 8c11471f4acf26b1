#include "checkpointer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/runtime/collective_context.h"
#include "fsdpx/framework/trainer/checkpoint_state.h"
#include "fsdpx/checkpoint_names.h"
#include "fsdpx/hf_interop.h"
#include "rank_zero.h"
#include "seconds_since.h"
#include "fsdpx/framework/runtime/device.h"

namespace fs = std::filesystem;

namespace {

// The model's config.json for export-hf, or none when this configuration of the model has no
// Hugging Face counterpart (vit with re-attention): hf_config_json() says why by throwing, and
// export-hf, which asks again, repeats that reason.
std::optional<std::string> hf_config_of(const fsdpx::HuggingFaceModel* hf) {
  if (!hf) return std::nullopt;
  try {
    return hf->hf_config_json();
  } catch (const fsdpx::Error&) {
    return std::nullopt;
  }
}

}  // namespace
using json = nlohmann::json;

namespace fsdpx {

Checkpointer::Checkpointer(std::shared_ptr<CheckpointBackend> backend, const TrainSettings& settings,
                           std::string config_ini, const ProcessGroups& groups, RunDirectory& run_dir, Reporter& out,
                           CheckpointParts parts)
    : backend_(std::move(backend)),
      s_(settings),
      config_ini_(std::move(config_ini)),
      groups_(groups),
      run_dir_(run_dir),
      out_(out),
      parts_(parts),
      writer_(groups.world()->rank() == 0) {
  auto* streamed = dynamic_cast<StreamedCheckpointBackend*>(backend_.get());
  // On the CPU a synchronous save writes the tensors as they are: nothing to stage.
  if (!streamed || (!streamed->saves_in_background() && parts_.device->is_cpu())) return;
  saver_ = make_checkpoint_saver(*streamed, groups_, parts_.engine, parts_.device);
  if (writer_) {
    char l[200];
    std::snprintf(l, sizeof l, "checkpoints: %s, staged through a pool of at most %.0f MiB per rank (%s memory)",
                  saver_->background() ? "written in the background" : "written while the step waits",
                  static_cast<double>(saver_->pool_limit()) / (1 << 20), parts_.device->is_cpu() ? "host" : "pinned");
    out_.line(l);
  }
}

void Checkpointer::initial_weights() {
  auto* hf = dynamic_cast<HuggingFaceModel*>(&parts_.model);
  const std::string hf_dir = hf ? hf->hf_weights_dir() : "";
  if (s_.init_from.empty() && s_.save_init.empty() && hf_dir.empty()) return;
  if (!hf_dir.empty() && !s_.init_from.empty())
    throw Error("--init-from " + s_.init_from + " and the model's Hugging Face weights (" + hf_dir +
                ") both give the initial weights; keep one");
  CollectivePhase phase("checkpoint");
  CheckpointState st = weights_state(parts_.engine);
  const HostStaging staging = stage_on_host(st);
  const CheckpointContext ctx = checkpoint_context(groups_, parts_.engine);
  if (!hf_dir.empty()) {
    load_hf_weights(hf_dir, st, ctx, [hf](const std::string& n) { return hf->hf_name(n); },
                    [hf](const std::string& n) { return hf->hf_ignorable(n); });
    if (writer_) std::printf("initial weights from the Hugging Face checkpoint %s\n", hf_dir.c_str());
  }
  if (!s_.init_from.empty()) {
    load_checkpoint(s_.init_from, st, [&](CheckpointState& s) { load_initial_weights(s_.init_from, s, ctx); },
                    other_names());
    if (writer_) std::printf("initial weights from %s\n", s_.init_from.c_str());
  }
  staging.copy_back();
  if (!s_.save_init.empty()) {
    fs::path dir = fs::absolute(s_.save_init).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();  // "DIR/"
    st.config_ini = config_ini_;  // what made these weights (export-hf reads [model])
    if (const auto config = hf_config_of(hf)) st.trainer_state_json = json{{"hf_config", json::parse(*config)}}.dump();
    save_consolidated(dir.string(), st, ctx, /*with_optimizer=*/false);
    if (writer_) std::printf("initial weights written to %s/model.safetensors\n", s_.save_init.c_str());
  }
}

int64_t Checkpointer::restore() {
  if (saver_ && saver_->background()) {  // the pool's memory now, not in the first save's stall
    saver_->reserve(checkpoint_state(parts_.engine, parts_.optimizer, /*for_load=*/false));
    if (writer_)  // as the plan states it (RunPlan::checkpoint_pool_bytes, plan.json)
      out_.line("checkpoint staging pool: " + std::to_string(saver_->pool_allocated()) + " B allocated per rank");
  }
  if (s_.resume.empty()) return 0;
  CollectivePhase phase("checkpoint");
  std::string dir = s_.resume;
  Communicator& world = *groups_.control();
  if (s_.resume == "auto") {
    // Rank 0 alone moves back what an interrupted save left aside; then every rank lists.
    on_rank_zero(world, [&] { recover_interrupted_saves(run_dir_.checkpoints()); });
    auto latest = backend_->latest(run_dir_.checkpoints());
    dir = latest ? *latest : "";
    for (const auto& skipped : skipped_checkpoints(run_dir_.checkpoints()))  // never older without a word
      if (writer_) std::fprintf(stderr, "fsdpx: warning: --resume auto skips %s\n", skipped.c_str());
  }
  if (dir.empty()) {
    if (writer_)
      std::printf("no complete checkpoint under %s yet: starting from step 0\n", run_dir_.checkpoints().c_str());
    return 0;
  }
  CheckpointState st = checkpoint_state(parts_.engine, parts_.optimizer, /*for_load=*/true);
  const HostStaging staging = stage_on_host(st);
  const CheckpointContext ctx = checkpoint_context(groups_, parts_.engine);
  const bool from_dcp =
      load_checkpoint(dir, st, [&](CheckpointState& s) { backend_->load(dir, s, ctx); }, other_names());
  staging.copy_back();
  load_optimizer_state(st, parts_.optimizer);
  if (from_dcp) return resumed_from_dcp(dir, st.step);
  const TrainerState state = TrainerState::from_json(st.trainer_state_json);
  if (!state.has_data_position()) {
    if (writer_)
      std::printf("%s holds no data position (a library checkpoint, ShardedModule::save): the data starts from "
                  "its beginning\n", dir.c_str());
  } else {
    parts_.data.restore(state.data);
  }
  if (state.loss_scaler) parts_.scaling.restore(*state.loss_scaler);
  if (writer_) std::printf("resumed from %s at step %ld\n", dir.c_str(), static_cast<long>(st.step));
  if (st.step >= s_.steps)
    throw Error("the checkpoint " + dir + " is at step " + std::to_string(st.step) + ", not before --steps " +
                std::to_string(s_.steps) + "; raise --steps to train further");
  return st.step;
}

OtherNames Checkpointer::other_names() const {
  auto* names = dynamic_cast<CheckpointNames*>(&parts_.model);
  if (!names) return {};
  return [names](const std::string& n) { return names->other_checkpoint_names(n); };
}

int64_t Checkpointer::resumed_from_dcp(const std::string& dir, int64_t step) {
  // DCP saves tensors alone: the step is its optimizer's, and where the data was is not known.
  if (step == 0)
    throw Error("--resume " + dir + ": PyTorch's DCP checkpoint records no step, and its optimizer's is absent "
                "(no optim/<p>/step or state.<p>.step) or 0 (PyTorch 2.11's enable_consolidation writes "
                "0-dimensional tensors as zeros: resume from the sharded/ folder it writes beside); --init-from " +
                dir + " starts a run from its weights at step 0");
  if (step >= s_.steps)
    throw Error("the checkpoint " + dir + " is at step " + std::to_string(step) + ", not before --steps " +
                std::to_string(s_.steps) + "; raise --steps to train further");
  if (writer_)
    std::printf("resumed from %s at step %ld, its optimizer's (PyTorch's DCP checkpoint: no trainer state, so "
                "the data starts from its beginning%s)\n",
                dir.c_str(), static_cast<long>(step), parts_.scaling.active() ? " and the loss scale afresh" : "");
  return step;
}

TrainerState Checkpointer::trainer_state(int64_t step) const {
  TrainerState state;
  state.step = step;
  state.seed = s_.seed;
  state.data = parts_.data.state();
  state.hf_config = hf_config_of(dynamic_cast<HuggingFaceModel*>(&parts_.model));
  if (parts_.scaling.active()) state.loss_scaler = parts_.scaling.state();
  return state;
}

void Checkpointer::save(int64_t step) {
  if (!backend_) return;
  CollectivePhase phase("checkpoint");
  const std::string dir = (fs::path(run_dir_.checkpoints()) / checkpoint_dir_name(step)).string();
  CheckpointState st = checkpoint_state(parts_.engine, parts_.optimizer, /*for_load=*/false);
  st.step = step;
  st.trainer_state_json = trainer_state(step).to_json();
  st.config_ini = config_ini_;
  if (saver_) {
    saver_->save(
        dir, st,
        [this] {  // on the writer thread, once the checkpoint is complete
          if (writer_ && s_.keep_last > 0) prune_checkpoints(run_dir_.checkpoints(), s_.keep_last);
        },
        /*defer_staging=*/true);
    if (!saver_->background()) poll();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  stage_on_host(st);  // copies of the device's tensors, all at once (a backend without streamed saves)
  backend_->save(dir, st, checkpoint_context(groups_, parts_.engine));
  SaveFigures f;
  f.step = step;
  f.dir = dir;
  f.stall_s = f.write_s = seconds_since(t0);
  on_rank_zero(*groups_.control(), [&] {  // the others wait: the checkpoint is complete and pruned when they go on
    report(f);
    if (s_.keep_last > 0) prune_checkpoints(run_dir_.checkpoints(), s_.keep_last);
  });
  last_saved_ = dir;
}

void Checkpointer::settle() {
  if (saver_) saver_->settle();
}

void Checkpointer::poll() {
  if (!saver_ || saver_->in_flight()) return;
  for (const SaveFigures& f : saver_->take_finished()) {
    if (writer_) report(f);
    last_saved_ = f.dir;
  }
}

void Checkpointer::finish() {
  if (!saver_) return;
  const std::string dir = saver_->in_flight_dir();
  const auto t0 = std::chrono::steady_clock::now();
  saver_->settle();  // the last save's staging (every rank: its stall is the slowest rank's)
  saver_->wait();
  if (writer_ && !dir.empty() && saver_->background()) {
    char l[300];
    std::snprintf(l, sizeof l, "the run's end waited %.2f s for checkpoint %s to be written",
                  seconds_since(t0), dir.c_str());
    out_.line(l);
  }
  poll();
}

// Rank 0: the save's line, and its record in metrics.jsonl.
void Checkpointer::report(const SaveFigures& f) {
  char l[400];
  if (f.background) {
    char waited[80] = "";
    if (f.wait_s >= 0.001) std::snprintf(waited, sizeof waited, "; waited %.2f s for the save before", f.wait_s);
    char staged[80] = "";
    if (f.deferred) std::snprintf(staged, sizeof staged, ", staged in %.2f s on a thread of its own", f.stage_s);
    std::snprintf(l, sizeof l, "checkpoint at step %ld: %s (stall %.3f s%s, written in %.2f s in the background%s)",
                  static_cast<long>(f.step), f.dir.c_str(), f.stall_s, staged, f.write_s, waited);
  } else {
    std::snprintf(l, sizeof l, "checkpoint at step %ld: %s (%.2f s)", static_cast<long>(f.step), f.dir.c_str(),
                  f.write_s);
  }
  out_.line(l);
  parts_.metrics.log_checkpoint(f);
}

}  // namespace fsdpx
