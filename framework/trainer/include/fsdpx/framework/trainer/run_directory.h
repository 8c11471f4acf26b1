// RunDirectory: what a run leaves in --out DIR (config.ini, plan.json, metrics.jsonl,
// summary.json; checkpoints/ belongs to the checkpoint component). One rank writes; the others
// hold an inactive one.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

class FSDPX_API RunDirectory {
 public:
  // `dir` empty: the run leaves nothing. `writer`: this rank writes (rank 0).
  RunDirectory(std::string dir, bool writer);
  ~RunDirectory();  // releases the lock
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  // The lock a run holds on its directory for its whole life: DIR/.fsdpx-run.lock, flock()ed by
  // the writer and naming its process. The kernel releases it when that process ends, however it
  // ends, so a lock file that no live process holds never stops anyone.
  static constexpr const char* kLockFile = ".fsdpx-run.lock";
  // Refuses (fsdpx::Error naming the other run's pid and host) a `dir` that a running run
  // holds; passes for "" or a directory no run holds. For checks before any worker starts.
  static void check_not_in_use(const std::string& dir);

  bool active() const { return writer_ && !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  std::string path(const std::string& name) const;  // DIR/name
  std::string checkpoints() const;                  // DIR/checkpoints ("" without a directory)

  // Creates the directory, takes its lock (refusing, with the other run's pid, a directory that
  // a running run holds), and writes config.ini (`config_ini`, after a comment saying how to
  // reproduce the run on `world` ranks) and plan.json (`plan_json`). Throws fsdpx::Error naming
  // the file that cannot be written.
  void create(const std::string& config_ini, int world, const std::string& plan_json);
  // Opens metrics.jsonl for this run: a resumed run (`resumed_step` > 0) keeps the lines up to
  // its checkpoint's step and writes the rest anew.
  void open_metrics(int64_t resumed_step);
  // One JSON object per line, flushed.
  void append_metrics(const std::string& json_line);
  void write_summary(const std::string& json_text);
  void write_profile(const std::string& json_text);  // profile.json (--profile-step)
  // Each of these throws fsdpx::Error "cannot write PATH: <reason>" when the file cannot be
  // written; the trainer runs them on rank 0 through on_rank_zero, so every rank stops with it.

 private:
  std::string dir_;
  bool writer_;
  std::ofstream metrics_;
  int lock_fd_ = -1;
};

}  // namespace fsdpx
