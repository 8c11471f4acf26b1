#include "worker_pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "fsdpx/error.h"

namespace fsdpx {
namespace {

// `program` as execve needs it: as given when it names a path, else the first executable of
// that name on PATH.
std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  throw Error("cannot run " + program + ": not found on PATH");
}

void close_all(std::initializer_list<int> fds) {
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
}

// A worker forked by fork_waiting_workers, seen from the launcher.
struct Waiting {
  int rank = -1;
  pid_t pid = -1;
  int control = -1;         // the environment goes here
  int out = -1, err = -1;   // the read ends of its stdout and stderr
};

// The launcher's waiting workers until adopted; those never adopted are killed and reaped when
// the launcher exits.
struct WaitingWorkers {
  std::vector<Waiting> list;
  void reap() {
    for (auto& w : list) {
      if (w.pid > 0) {
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, nullptr, 0);
      }
      close_all({w.control, w.out, w.err});
    }
    list.clear();
  }
  ~WaitingWorkers() { reap(); }
};

WaitingWorkers& waiting() {
  static WaitingWorkers w;
  return w;
}

}  // namespace

void reap_waiting_workers() { waiting().reap(); }

namespace {

int threads_of_this_process() {
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

// In a waiting worker: reads the environment the launcher hands over (its length in decimal and a
// newline, then NUL-terminated "KEY=value" strings) and makes it this process's; exits (0) when
// the launcher closes the socket without one. The strings stay allocated: the environment
// points into them.
void receive_environment(int control) {
  std::string block;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(control, buf, sizeof buf);
    if (n > 0) block.append(buf, static_cast<size_t>(n));
    if (n == 0) break;
    if (n < 0 && errno != EINTR) break;
  }
  if (block.empty()) ::_exit(0);
  const size_t newline = block.find('\n');
  if (newline == std::string::npos || std::strtoull(block.c_str(), nullptr, 10) != block.size() - newline - 1) {
    static const char kCut[] = "fsdpx: a worker forked by the launcher got only part of its environment\n";
    const ssize_t rc = ::write(STDERR_FILENO, kCut, sizeof kCut - 1);
    (void)rc;
    ::_exit(127);
  }
  ::clearenv();
  for (size_t start = newline + 1; start < block.size(); start = block.find('\0', start) + 1)
    ::putenv(::strdup(block.c_str() + start));
}

// Hands a waiting worker its environment. False when it could not be sent whole (the worker
// died meanwhile, and is reaped as any other, or it gets part and says so).
bool hand_over(int control, const std::vector<std::string>& env) {
  std::string entries;
  for (const auto& kv : env) entries += kv + '\0';
  const std::string block = std::to_string(entries.size()) + "\n" + entries;
  size_t sent = 0;
  while (sent < block.size()) {
    const ssize_t n = ::send(control, block.data() + sent, block.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(control, SHUT_WR);
  ::close(control);
  return sent == block.size();
}

}  // namespace

int fork_waiting_workers(int n) {
  if (n < 1 || threads_of_this_process() != 1) return -1;
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t launcher = ::getpid();
  auto& list = waiting().list;
  for (int rank = 0; rank < n; ++rank) {
    int control[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, control) != 0 || ::pipe2(out, O_CLOEXEC) != 0 ||
        ::pipe2(err, O_CLOEXEC) != 0) {
      close_all({control[0], control[1], out[0], out[1], err[0], err[1]});
      return -1;  // the ranks not forked here start by exec
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(127);
      for (const auto& w : list) close_all({w.control, w.out, w.err});
      list.clear();
      close_all({control[0], out[0], err[0]});
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      close_all({out[1], err[1]});
      receive_environment(control[1]);
      ::close(control[1]);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      return rank;
    }
    close_all({control[1], out[1], err[1]});
    if (pid < 0) {
      close_all({control[0], out[0], err[0]});
      return -1;
    }
    list.push_back({rank, pid, control[0], out[0], err[0]});
  }
  return -1;
}

WorkerPool::WorkerPool(const std::string& name, const std::vector<std::string>& argv, bool adopt_waiting)
    : name_(name),
      path_(resolve_program(argv.at(0))),
      argv_(argv),
      launcher_pid_(::getpid()),
      adopt_waiting_(adopt_waiting) {}

WorkerPool::~WorkerPool() {
  for (auto& w : workers_) {
    if (w.running) {
      ::kill(w.pid, SIGKILL);
      ::waitpid(w.pid, nullptr, 0);
    }
    for (auto& s : w.streams)
      if (s.fd >= 0) ::close(s.fd);
  }
}

void WorkerPool::start(int rank, const std::vector<std::string>& env) {
  Worker w;
  w.rank = rank;
  w.running = true;
  for (auto& waiting_worker : waiting().list) {
    if (!adopt_waiting_ || waiting_worker.rank != rank || waiting_worker.pid < 0) continue;
    if (!hand_over(waiting_worker.control, env))
      std::fprintf(stderr, "%s: could not hand worker %d its environment: %s\n", name_.c_str(), rank,
                   std::strerror(errno));
    w.pid = waiting_worker.pid;
    w.streams[0] = Stream{waiting_worker.out, stdout, {}};
    w.streams[1] = Stream{waiting_worker.err, stderr, {}};
    waiting_worker = Waiting{};
    workers_.push_back(std::move(w));
    return;
  }
  // Everything the child uses is built here, before fork: after fork in a process with threads,
  // only async-signal-safe calls are allowed (no allocation, no PATH search).
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv_) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& kv : env) cenv.push_back(const_cast<char*>(kv.c_str()));
  cenv.push_back(nullptr);
  const std::string cannot_run = name_ + ": cannot run " + path_ + "\n";
  const char* path = path_.c_str();
  const pid_t launcher = launcher_pid_;

  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    close_all({out[0], out[1], err[0], err[1]});
    throw Error("cannot create a pipe for worker " + std::to_string(rank) + ": " + std::strerror(e));
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    close_all({out[0], out[1], err[0], err[1]});
    throw Error("cannot start worker " + std::to_string(rank) + ": fork failed: " + std::strerror(e));
  }
  if (pid == 0) {
    // Worker: die with the launcher; own stdout/stderr; the prepared environment; exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(127);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::execve(path, cargv.data(), cenv.data());
    const ssize_t rc = ::write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
    (void)rc;
    ::_exit(127);
  }
  close_all({out[1], err[1]});
  w.pid = pid;
  w.streams[0] = Stream{out[0], stdout, {}};
  w.streams[1] = Stream{err[0], stderr, {}};
  workers_.push_back(std::move(w));
}

void WorkerPool::relay(Worker& w, Stream& s, bool flush_all) {
  const std::string prefix = "[rank" + std::to_string(w.rank) + "]: ";
  size_t start = 0;
  for (;;) {
    const size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    std::fputs((prefix + s.pending.substr(start, nl - start + 1)).c_str(), s.out);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (flush_all && !s.pending.empty()) {
    std::fputs((prefix + s.pending + "\n").c_str(), s.out);
    s.pending.clear();
  }
  std::fflush(s.out);
}

void WorkerPool::relay_output(int timeout_ms, int wake_fd) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, Stream*>> owners;
  for (auto& w : workers_)
    for (auto& s : w.streams)
      if (s.fd >= 0) {
        fds.push_back({s.fd, POLLIN, 0});
        owners.emplace_back(&w, &s);
      }
  fds.push_back({wake_fd, POLLIN, 0});
  ::poll(fds.data(), fds.size(), timeout_ms);
  for (size_t k = 0; k + 1 < fds.size(); ++k) {
    if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    auto [w, s] = owners[k];
    char buf[65536];
    const ssize_t n = ::read(s->fd, buf, sizeof buf);
    if (n > 0) {
      s->pending.append(buf, static_cast<size_t>(n));
      relay(*w, *s, false);
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      relay(*w, *s, true);
      ::close(s->fd);
      s->fd = -1;
    }
  }
}

std::vector<const WorkerPool::Worker*> WorkerPool::reap() {
  std::vector<const Worker*> done;
  for (auto& w : workers_) {
    if (!w.running) continue;
    int status = 0;
    const pid_t p = ::waitpid(w.pid, &status, WNOHANG);
    if (p == -1 && errno == ECHILD) {
      status = 0xff00;  // reaped elsewhere (SIGCHLD ignored): gone, status unknown (reads as 255)
    } else if (p != w.pid) {
      continue;
    }
    w.running = false;
    w.status = status;
    done.push_back(&w);
  }
  return done;
}

void WorkerPool::drain() {
  for (auto& w : workers_)
    for (auto& s : w.streams) {
      if (s.fd < 0) continue;
      ::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK);
      char buf[65536];
      ssize_t n;
      while ((n = ::read(s.fd, buf, sizeof buf)) > 0) s.pending.append(buf, static_cast<size_t>(n));
      relay(w, s, true);
      ::close(s.fd);
      s.fd = -1;
    }
}

void WorkerPool::signal_all(int sig) {
  for (auto& w : workers_)
    if (w.running) ::kill(w.pid, sig);
}

bool WorkerPool::any_running() const {
  for (const auto& w : workers_)
    if (w.running) return true;
  return false;
}

}  // namespace fsdpx
