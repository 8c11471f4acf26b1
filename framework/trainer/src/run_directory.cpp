#include "fsdpx/framework/trainer/run_directory.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdpx/error.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace fsdpx {
namespace {

// "cannot write PATH: <the system's reason>", for a stream that failed just now.
[[noreturn]] void write_failed(const std::string& path) {
  const int err = errno;
  throw Error("cannot write " + path + (err ? ": " + std::string(std::strerror(err)) : std::string()));
}

void write_whole(const std::string& path, const std::string& text) {
  errno = 0;
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.flush();
  if (!out) write_failed(path);
}

}  // namespace

RunDirectory::RunDirectory(std::string dir, bool writer) : dir_(std::move(dir)), writer_(writer) {}

std::string RunDirectory::path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

std::string RunDirectory::checkpoints() const { return dir_.empty() ? "" : path("checkpoints"); }

void RunDirectory::create(const std::string& config_ini, int world, const std::string& plan_json) {
  if (!active()) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw Error("--out " + dir_ + " cannot be created: " + ec.message());
  write_whole(path("config.ini"), "# fsdpx-train --config " + path("config.ini") + " --nproc-per-node " +
                                      std::to_string(world) + "  reproduces this run\n" + config_ini);
  write_whole(path("plan.json"), plan_json + "\n");
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
  errno = 0;
  metrics_.open(path("metrics.jsonl"), std::ios::trunc);
  for (const auto& l : kept) metrics_ << l << "\n";
  metrics_.flush();
  if (!metrics_) write_failed(path("metrics.jsonl"));
}

void RunDirectory::append_metrics(const std::string& json_line) {
  if (!metrics_.is_open()) return;
  errno = 0;
  metrics_ << json_line << std::endl;
  if (!metrics_) write_failed(path("metrics.jsonl"));
}

void RunDirectory::write_summary(const std::string& json_text) {
  if (active()) write_whole(path("summary.json"), json_text + "\n");
}

}  // namespace fsdpx
