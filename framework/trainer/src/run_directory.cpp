#include "fsdpx/framework/trainer/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdpx/error.h"
#include "fsdpx/files.h"

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

// Who holds a lock file: its text ("pid 123 on host x since ..."), or "" when it cannot be read.
std::string holder(int fd) {
  char buf[256];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

[[noreturn]] void in_use(const std::string& dir, int fd) {
  const std::string who = holder(fd);
  ::close(fd);
  throw Error("--out " + dir + " is in use by another run (" + (who.empty() ? "its pid is not recorded" : who) +
              "); wait for it to end, or give another --out");
}

// Opens DIR's lock file (never through a symlink) and tries to lock it; -1 when the file is absent
// and `create` is false. Throws when another process holds the lock.
int lock_file(const std::string& dir, bool create, int operation) {
  const std::string path = (fs::path(dir) / RunDirectory::kLockFile).string();
  const int fd = ::open(path.c_str(), (create ? O_RDWR | O_CREAT : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (!create && errno == ENOENT) return -1;
    throw Error("--out " + dir + ": cannot open its lock file " + path + ": " + std::strerror(errno));
  }
  if (::flock(fd, operation | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) in_use(dir, fd);
    const int err = errno;
    if (err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP || err == EINVAL) {
      // Some shared filesystems (Lustre without -o flock) have no locks: run, but say so.
      if (create)
        std::fprintf(stderr, "fsdpx: warning: --out %s: its filesystem cannot lock %s (%s); a second run on this "
                     "directory will not be refused\n", dir.c_str(), path.c_str(), std::strerror(err));
      return fd;
    }
    ::close(fd);
    throw Error("--out " + dir + ": cannot lock " + path + ": " + std::strerror(err));
  }
  return fd;
}

// Writes who holds the lock into its file: "pid 123 on node1, since YYYY-MM-DD hh:mm:ss" (local time).
void sign_lock(const std::string& dir, int fd) {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32] = "";
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  const std::string who = "pid " + std::to_string(::getpid()) + " on " + host + ", since " + when + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) != static_cast<ssize_t>(who.size()))
    throw Error("--out " + dir + ": cannot write its lock file: " + std::strerror(errno));
}

}  // namespace

RunDirectory::RunDirectory(std::string dir, bool writer) : dir_(std::move(dir)), writer_(writer) {}

RunDirectory::~RunDirectory() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // the kernel drops the flock with the last descriptor
}

void RunDirectory::check_not_in_use(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  const int fd = lock_file(dir, /*create=*/false, LOCK_SH);
  if (fd >= 0) ::close(fd);
}

std::string RunDirectory::path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

std::string RunDirectory::checkpoints() const { return dir_.empty() ? "" : path("checkpoints"); }

void RunDirectory::create(const std::string& config_ini, int world, const std::string& plan_json) {
  if (!active()) return;
  std::error_code ec;
  if (fs::exists(dir_, ec) && !fs::is_directory(dir_, ec))
    throw Error("--out " + dir_ + " is " + (file_kind(dir_).empty() ? "a file" : file_kind(dir_)) +
                ", not a directory; give a directory for the run's files");
  fs::create_directories(dir_, ec);
  if (ec) throw Error("--out " + dir_ + " cannot be created: " + ec.message());
  lock_fd_ = lock_file(dir_, /*create=*/true, LOCK_EX);
  sign_lock(dir_, lock_fd_);
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

void RunDirectory::write_profile(const std::string& json_text) {
  if (active()) write_whole(path("profile.json"), json_text + "\n");
}

}  // namespace fsdpx
