// The checkpoints under a run's checkpoint directory: names, listing, pruning.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "fsdpx/error.h"
#include "fsdpx/files.h"
#include "fsdpx/framework/base/fault_injection.h"
#include "fsdpx/framework/base/program_options.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "checkpoint_files.h"
#include "dcp_index.h"
#include "sharded_index.h"

namespace fs = std::filesystem;

namespace fsdpx {

using namespace ckpt;

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

void recover_interrupted_saves(const std::string& root) {
  std::error_code ec;
  if (root.empty() || !fs::is_directory(root, ec)) return;
  // A save that died between moving the old checkpoint aside and removing it: move it back.
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".old-step-", 0) != 0 || fs::exists(fs::path(root) / name.substr(5))) continue;
    std::error_code rec;
    fs::rename(e.path(), fs::path(root) / name.substr(5), rec);
    if (rec)
      throw Error("cannot move the checkpoint " + e.path().string() + " back to " + name.substr(5) +
                  " after an interrupted save: " + rec.message());
  }
}

namespace {

// The step-N directories under `root` (N a number), whatever their state, oldest first.
std::vector<std::pair<int64_t, fs::path>> step_directories(const std::string& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (root.empty() || !fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code dir_ec;
    if (name.rfind("step-", 0) != 0 || name.size() == 5 || !e.is_directory(dir_ec)) continue;
    char* end = nullptr;
    const long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (*end == '\0' && step >= 0) out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string missing_or_empty(const fs::path& p) {
  const std::string kind = file_kind(p.string());
  if (kind == "missing") return p.filename().string() + " is missing";
  if (!kind.empty()) return p.filename().string() + " is " + kind + ", not a file";
  return "";
}

// The step a directory's name says, for step-NNNNNNNN; none for another name.
std::optional<int64_t> named_step(const fs::path& dir) {
  const std::string name = dir.filename().string();
  char* end = nullptr;
  const long long step = name.rfind("step-", 0) == 0 && name.size() > 5 ? std::strtoll(name.c_str() + 5, &end, 10) : -1;
  if (step < 0 || *end != '\0') return std::nullopt;
  return step;
}

std::string sharded_problem(const fs::path& dir) {
  Index ix = read_index(dir.string());
  const int64_t step = ix.j.value("step", int64_t{0});
  if (const auto named = named_step(dir); named && *named != step)
    return "index.json records step " + std::to_string(step) + ", the directory's name step " + std::to_string(*named);
  const json sizes = ix.j.value("files", json::object());
  for (auto it = sizes.begin(); it != sizes.end(); ++it) {
    std::error_code ec;
    const fs::path f = dir / it.key();
    if (it.key().find('/') != std::string::npos || it.key().find("..") != std::string::npos)
      return "index.json lists the file '" + it.key() + "', outside the checkpoint";
    if (std::string why = missing_or_empty(f); !why.empty()) return why;
    const auto size = fs::file_size(f, ec);
    if (ec) return it.key() + " cannot be read: " + ec.message();
    if (it.value().is_number_integer() && static_cast<int64_t>(size) != it.value().get<int64_t>())
      return it.key() + " has " + std::to_string(size) + " bytes, index.json records " +
             std::to_string(it.value().get<int64_t>());
  }
  for (const char* name : {"trainer_state.json", "config.ini"})
    if (std::string why = missing_or_empty(dir / name); !why.empty()) return why;
  if (std::string why = trainer_state_problem(read_text(dir / "trainer_state.json"), step); !why.empty())
    return "trainer_state.json " + why;
  const std::string ini = read_text(dir / "config.ini");
  try {
    parse_ini(ini, boost::program_options::options_description(), "config.ini");
  } catch (const Error& e) {
    return "config.ini does not parse as an INI file (" + std::string(e.what()) + ")";
  }
  return "";
}

std::string consolidated_problem(const fs::path& dir) {
  for (const char* name : {"model.safetensors", "digests.json"})
    if (std::string why = missing_or_empty(dir / name); !why.empty()) return why;
  const SafetensorsReader file((dir / "model.safetensors").string());
  const json digests = parse_json_file(dir / "digests.json");
  if (!digests.is_object()) return "digests.json is not an object of digests";
  for (const auto& [name, entry] : file.entries())
    if (!digests.contains(name) || !digests[name].is_string())
      return "digests.json has no digest of tensor '" + name + "'";
  auto m = file.metadata();
  std::optional<int64_t> step;
  if (m.count("step")) step = parse_step(m["step"], (dir / "model.safetensors").string());
  if (m.count("trainer_state") && !m["trainer_state"].empty())
    if (std::string why = trainer_state_problem(m["trainer_state"], step); !why.empty())
      return "model.safetensors's trainer state " + why;
  return "";
}

}  // namespace

std::string trainer_state_problem(const std::string& text, std::optional<int64_t> step) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "is not valid JSON";
  if (!j.is_object()) return "is not a JSON object";
  if (!j.contains("step") || !j["step"].is_number_integer()) return "has no integer \"step\"";
  if (step && j["step"].get<int64_t>() != *step)
    return "records step " + std::to_string(j["step"].get<int64_t>()) + ", the checkpoint is of step " +
           std::to_string(*step);
  if (!j.contains("seed") || !j["seed"].is_number_unsigned()) return "has no \"seed\" (a non-negative integer)";
  if (!j.contains("data") || !j["data"].is_object()) return "has no data position (\"data\", an object)";
  if (j.contains("hf_config") && !j["hf_config"].is_object()) return "has an \"hf_config\" that is not an object";
  if (j.contains("loss_scaler")) {
    const json& ls = j["loss_scaler"];
    if (!ls.is_object() || !ls.contains("state") || !ls.contains("skipped_steps") ||
        !ls["skipped_steps"].is_number_integer())
      return "has a malformed \"loss_scaler\"";
  }
  return "";
}

std::string checkpoint_problem(const std::string& dir) {
  const fs::path d(dir);
  try {
    if (file_kind(dir) != "a directory") return "it is not a directory";
    if (fs::exists(d / "index.json")) return sharded_problem(d);
    if (is_dcp_folder(dir)) return "";  // PyTorch's DCP records no completeness: the read checks coverage
    if (fs::exists(d / "model.safetensors") || fs::exists(d / "digests.json")) return consolidated_problem(d);
    if (fs::exists(d / "trainer_state.json") || fs::exists(d / "rank-00000.safetensors"))
      return "index.json is missing";
    return "it holds neither index.json (sharded) nor model.safetensors (consolidated)";
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& [step, dir] : step_directories(root))
    if (checkpoint_problem(dir.string()).empty()) out.emplace_back(step, dir.string());
  return out;
}

std::vector<std::string> skipped_checkpoints(const std::string& root) {
  std::vector<std::string> out;
  const auto all = step_directories(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string why = checkpoint_problem(it->second.string());
    if (why.empty()) break;
    out.push_back(it->second.string() + ": " + why);
  }
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  auto all = list_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

void prune_checkpoints(const std::string& root, int64_t keep) {
  auto all = list_checkpoints(root);
  std::vector<fs::path> gone;
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < all.size(); ++i) gone.emplace_back(all[i].second);
  // Temporary directories of saves that never completed (the current save is done by now).
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.path().filename().string().rfind(".tmp-step-", 0) == 0) gone.push_back(e.path());
  for (const auto& p : gone) {
    fs::remove_all(p, ec);
    if (ec)
      throw Error("--keep-last " + std::to_string(keep) + ": cannot remove " + p.string() + ": " + ec.message());
  }
}

void maybe_fault(const char* point, int rank) {
  if (!fault_requested(point, rank)) return;
  std::fprintf(stderr, "fsdpx: FSDPX_FAULT=%s:%d: rank %d exits abruptly\n", point, rank, rank);
  std::fflush(stderr);
  ::_exit(9);
}

}  // namespace fsdpx
