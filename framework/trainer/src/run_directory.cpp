#include "fsdpx/framework/trainer/run_directory.h"

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdpx/error.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace fsdpx {

RunDirectory::RunDirectory(std::string dir, bool writer) : dir_(std::move(dir)), writer_(writer) {}

std::string RunDirectory::path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

std::string RunDirectory::checkpoints() const { return dir_.empty() ? "" : path("checkpoints"); }

void RunDirectory::create(const std::string& config_ini, int world, const std::string& plan_json) {
  if (!active()) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw Error("--out " + dir_ + " cannot be created: " + ec.message());
  std::ofstream ini(path("config.ini"));
  ini << "# fsdpx-train --config " << path("config.ini") << " --nproc-per-node " << world << "  reproduces this run\n"
      << config_ini;
  if (!ini) throw Error("cannot write " + path("config.ini"));
  std::ofstream(path("plan.json")) << plan_json << "\n";
}

void RunDirectory::open_metrics(int64_t resumed_step) {
  if (!active()) return;
  std::vector<std::string> kept;
  if (resumed_step > 0) {
    std::ifstream old(path("metrics.jsonl"));
    std::string line;
    while (std::getline(old, line)) {
      try {
        if (json::parse(line).value("step", int64_t{0}) <= resumed_step) kept.push_back(line);
      } catch (const json::exception&) {
      }
    }
  }
  metrics_.open(path("metrics.jsonl"), std::ios::trunc);
  for (const auto& l : kept) metrics_ << l << "\n";
}

void RunDirectory::append_metrics(const std::string& json_line) {
  if (metrics_.is_open()) metrics_ << json_line << std::endl;
}

void RunDirectory::write_summary(const std::string& json_text) {
  if (active()) std::ofstream(path("summary.json")) << json_text << "\n";
}

}  // namespace fsdpx
