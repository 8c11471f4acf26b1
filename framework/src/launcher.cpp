#include "fsdpx/framework/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

extern char** environ;

#include "fsdpx/error.h"

namespace fsdpx {
namespace {

using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  unsigned char s = static_cast<unsigned char>(sig);
  ssize_t rc = ::write(g_signal_pipe[1], &s, 1);
  (void)rc;
}

int free_port(const std::string& addr) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(std::string("cannot open a socket to pick a free port: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  sa.sin_addr.s_addr = addr == "127.0.0.1" ? htonl(INADDR_LOOPBACK) : htonl(INADDR_ANY);
  socklen_t len = sizeof sa;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(std::string("cannot pick a free port: ") + std::strerror(err));
  }
  int port = ntohs(sa.sin_port);
  ::close(fd);
  return port;
}

struct Stream {
  int fd = -1;
  FILE* out = nullptr;
  std::string pending;
};

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream streams[2];
};

void relay(Worker& w, Stream& s, bool flush_all) {
  const std::string prefix = "[rank" + std::to_string(w.rank) + "]: ";
  size_t start = 0;
  for (;;) {
    size_t nl = s.pending.find('\n', start);
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

std::string how(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "stopped";
}

int code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

std::string self_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

LauncherArgs split_launcher_args(int argc, char** argv) {
  LauncherArgs a;
  a.rest.push_back(argc > 0 ? argv[0] : "");
  auto number = [](const std::string& flag, const std::string& v, int lo, int hi) {
    char* end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end || n < lo || n > hi)
      throw Error(flag + " expects an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                  ", got '" + v + "'");
    return static_cast<int>(n);
  };
  const std::string flag = "--nproc-per-node";
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == flag) {
      if (i + 1 >= argc) throw Error(flag + " needs a value");
      a.nproc_per_node = number(flag, argv[++i], 1, 1024);
    } else if (s.rfind(flag + "=", 0) == 0) {
      a.nproc_per_node = number(flag, s.substr(flag.size() + 1), 1, 1024);
    } else {
      a.rest.push_back(s);
    }
  }
  return a;
}

std::optional<int> launch_if_requested(int argc, char** argv, const std::string& name,
                                       std::vector<std::string>& worker_args) {
  LauncherArgs la = split_launcher_args(argc, argv);
  worker_args.assign(la.rest.begin() + 1, la.rest.end());
  if (la.nproc_per_node == 0 || std::getenv("FSDPX_LAUNCHED")) return std::nullopt;
  const char* step = std::getenv("SLURM_STEP_ID");
  const char* ntasks = std::getenv("SLURM_NTASKS");
  if (std::getenv("RANK") || (step && ntasks && std::atoi(ntasks) > 1))
    throw Error(std::string("--nproc-per-node starts workers itself, but this process is already one of ") +
                (std::getenv("RANK") ? "torchrun's workers (RANK is set)"
                                     : "Slurm's tasks (SLURM_STEP_ID and SLURM_NTASKS > 1)") +
                "; drop --nproc-per-node and let the launcher place the ranks");
  LaunchOptions lo;
  lo.nproc = la.nproc_per_node;
  lo.argv = la.rest;
  lo.argv[0] = self_executable();
  lo.name = name;
  return launch_local(lo);
}

int launch_local(const LaunchOptions& o) {
  if (o.nproc < 1) throw Error("--nproc-per-node must be at least 1, got " + std::to_string(o.nproc));
  if (o.argv.empty()) throw Error("launch_local: no worker command");
  const int port = o.master_port ? o.master_port : free_port(o.master_addr);

  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(std::string("cannot create a pipe: ") + std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);

  std::vector<Worker> workers(o.nproc);
  std::vector<char*> cargv;
  for (const auto& a : o.argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t launcher_pid = ::getpid();
  // If starting the workers fails half-way: stop those started, release everything, rethrow.
  auto abandon = [&](const std::string& why) {
    for (auto& w : workers) {
      if (w.running) {
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, nullptr, 0);
      }
      for (auto& s : w.streams)
        if (s.fd >= 0) ::close(s.fd);
    }
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    throw Error(why);
  };

  for (int r = 0; r < o.nproc; ++r) {
    Worker& w = workers[r];
    w.rank = r;
    // The environment is built before fork: the child only calls async-signal-safe functions.
    const std::map<std::string, std::string> mine = {
        {"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(o.nproc)},
        {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
        {"GROUP_RANK", "0"}, {"GROUP_WORLD_SIZE", "1"}, {"ROLE_RANK", std::to_string(r)},
        {"ROLE_WORLD_SIZE", std::to_string(o.nproc)}, {"MASTER_ADDR", o.master_addr},
        {"MASTER_PORT", std::to_string(port)}, {"FSDPX_LAUNCHED", "1"}};
    std::vector<std::string> env;
    for (char** e = environ; e && *e; ++e) {
      std::string kv = *e;
      if (!mine.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    for (const auto& [k, v] : mine) env.push_back(k + "=" + v);
    std::vector<char*> cenv;
    for (auto& kv : env) cenv.push_back(kv.data());
    cenv.push_back(nullptr);
    const std::string cannot_run = o.name + ": cannot run " + o.argv[0] + "\n";

    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1]})
        if (fd >= 0) ::close(fd);
      abandon(std::string("cannot create a pipe for worker ") + std::to_string(r) + ": " + std::strerror(e));
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
      abandon(std::string("cannot start worker ") + std::to_string(r) + ": fork failed: " + std::strerror(e));
    }
    if (pid == 0) {
      // Worker: die with the launcher; own stdout/stderr; torchrun's variables; exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher_pid) ::_exit(127);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::execvpe(cargv[0], cargv.data(), cenv.data());
      ssize_t rc = ::write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
      (void)rc;
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    w.pid = pid;
    w.running = true;
    w.streams[0] = Stream{out[0], stdout, {}};
    w.streams[1] = Stream{err[0], stderr, {}};
  }

  int failed_rank = -1, failed_status = 0, interrupted = 0;
  bool stopping = false;
  Clock::time_point kill_at{};
  auto stop_all = [&](int sig) {
    for (auto& w : workers)
      if (w.running) ::kill(w.pid, sig);
  };

  for (;;) {
    // Output.
    std::vector<pollfd> fds;
    std::vector<std::pair<int, int>> owners;  // (worker, stream)
    for (int i = 0; i < o.nproc; ++i)
      for (int s = 0; s < 2; ++s)
        if (workers[i].streams[s].fd >= 0) {
          fds.push_back({workers[i].streams[s].fd, POLLIN, 0});
          owners.emplace_back(i, s);
        }
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);
    for (size_t k = 0; k + 1 < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Worker& w = workers[owners[k].first];
      Stream& s = w.streams[owners[k].second];
      char buf[65536];
      ssize_t n = ::read(s.fd, buf, sizeof buf);
      if (n > 0) {
        s.pending.append(buf, static_cast<size_t>(n));
        relay(w, s, false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        relay(w, s, true);
        ::close(s.fd);
        s.fd = -1;
      }
    }
    // Signals to the launcher.
    unsigned char sig = 0;
    while (::read(g_signal_pipe[0], &sig, 1) == 1) {
      if (!interrupted) {
        interrupted = sig;
        std::fprintf(stderr, "%s: got %s; stopping all ranks\n", o.name.c_str(), strsignal(sig));
      }
      stop_all(SIGTERM);
      if (!stopping) {
        stopping = true;
        kill_at = Clock::now() + o.grace;
      }
    }
    // Workers.
    for (auto& w : workers) {
      if (!w.running) continue;
      int status = 0;
      pid_t p = ::waitpid(w.pid, &status, WNOHANG);
      if (p == -1 && errno == ECHILD) {
        status = 0xff00;  // reaped elsewhere (SIGCHLD ignored): gone, status unknown (reads as 255)
      } else if (p != w.pid) {
        continue;
      }
      w.running = false;
      w.status = status;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && failed_rank < 0 && !interrupted && !stopping) {
        failed_rank = w.rank;
        failed_status = status;
        std::fprintf(stderr, "%s: rank %d %s; stopping the other ranks\n", o.name.c_str(), w.rank,
                     how(status).c_str());
        stop_all(SIGTERM);
        stopping = true;
        kill_at = Clock::now() + o.grace;
      }
    }
    if (stopping && Clock::now() >= kill_at) {
      stop_all(SIGKILL);
      kill_at = Clock::now() + std::chrono::hours(1);
    }
    bool any_running = false;
    for (auto& w : workers) any_running |= w.running;
    if (!any_running) {
      // Every worker is gone: relay what is left in the pipes without waiting for anything that
      // may still hold them open (a grandchild), then finish.
      for (auto& w : workers)
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
      break;
    }
  }

  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  if (interrupted) return 128 + interrupted;
  if (failed_rank >= 0) {
    std::fprintf(stderr, "%s: failed: rank %d %s\n", o.name.c_str(), failed_rank, how(failed_status).c_str());
    return code_of(failed_status) ? code_of(failed_status) : 1;
  }
  return 0;
}

}  // namespace fsdpx
