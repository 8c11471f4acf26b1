// The checkpoints under a run's checkpoint directory: names, listing, pruning.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "format_support.h"

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

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (root.empty() || !fs::is_directory(root, ec)) return out;
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
  const char* f = std::getenv("FSDPX_FAULT");
  if (!f) return;
  const std::string want = std::string(point) + ":" + std::to_string(rank);
  if (want == f) {
    std::fprintf(stderr, "fsdpx: FSDPX_FAULT=%s: rank %d exits abruptly\n", f, rank);
    std::fflush(stderr);
    ::_exit(9);
  }
}

}  // namespace fsdpx
