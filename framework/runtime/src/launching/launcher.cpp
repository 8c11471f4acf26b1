#include "fsdpx/framework/runtime/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>

extern char** environ;

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/cpu_resources.h"
#include "worker_pool.h"

// Present only in programs built with LeakSanitizer (ASan includes it) or with coverage.
extern "C" {
__attribute__((weak)) void __lsan_do_leak_check();
__attribute__((weak)) void __gcov_dump();
__attribute__((weak)) int __llvm_profile_write_file();
}

namespace fsdpx {
namespace {

using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  unsigned char s = static_cast<unsigned char>(sig);
  ssize_t rc = ::write(g_signal_pipe[1], &s, 1);
  (void)rc;
}

// Binds `port` (0: the kernel's pick) on `addr` and returns the port bound, or -1 with errno set.
int try_bind(const std::string& addr, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = addr == "127.0.0.1" ? htonl(INADDR_LOOPBACK) : htonl(INADDR_ANY);
  socklen_t len = sizeof sa;
  int bound = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
    bound = ntohs(sa.sin_port);
  const int err = errno;
  ::close(fd);
  errno = err;
  return bound;
}

}  // namespace

int pick_rendezvous_port(const std::string& addr) {
  int lo = 32768, hi = 60999;  // the kernel's ephemeral ports, for outgoing connections
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
    std::fclose(f);
  }
  // Below that range if it leaves room (from 10000), else above it.
  const int first = lo - 1 >= 11000 ? 10000 : hi + 1, last = lo - 1 >= 11000 ? lo - 1 : 65535;
  if (last - first >= 1000) {
    std::random_device seed;
    std::mt19937 rng(seed());
    std::uniform_int_distribution<int> pick(first, last);
    for (int attempt = 0; attempt < 200; ++attempt)
      if (const int p = try_bind(addr, pick(rng)); p > 0) return p;
  }
  const int p = try_bind(addr, 0);
  if (p <= 0) throw Error(std::string("cannot pick a free port for the rendezvous: ") + std::strerror(errno));
  return p;
}

namespace {

// `note` follows a SIGKILL that the launcher did not send.
std::string how(int status, const std::string& note = "") {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")" +
           (WTERMSIG(status) == SIGKILL && !note.empty() ? ", probably by the kernel's out-of-memory killer: " + note
                                                         : "");
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

namespace {

// Why this process may not launch `la`'s workers; empty when it may.
std::string launch_refused(const LauncherArgs& la) {
  const char* step = std::getenv("SLURM_STEP_ID");
  const char* ntasks = std::getenv("SLURM_NTASKS");
  if (std::getenv("RANK") || (step && ntasks && std::atoi(ntasks) > 1))
    return std::string("--nproc-per-node starts workers itself, but this process is already one of ") +
           (std::getenv("RANK") ? "torchrun's workers (RANK is set)"
                                : "Slurm's tasks (SLURM_STEP_ID and SLURM_NTASKS > 1)") +
           "; drop --nproc-per-node and let the launcher place the ranks";
  // A plain bound, whatever memory says: far more processes than CPUs only thrash.
  const int cpus = std::max(1, affinity_cpus()), most = 32 * cpus;
  if (la.nproc_per_node > most)
    return "--nproc-per-node " + std::to_string(la.nproc_per_node) +
           " starts more workers than this machine can run: " + std::to_string(cpus) +
           " CPU(s) in this process's affinity mask allow at most " + std::to_string(most) +
           " (32 per CPU); use more nodes (torchrun, Slurm) for more ranks";
  return "";
}

bool launches(const LauncherArgs& la) { return la.nproc_per_node > 0 && !std::getenv("FSDPX_LAUNCHED"); }

// FSDPX_EXEC_WORKERS=1: every worker starts by exec, from the program's first instruction (for a
// debugger or tool that follows exec); unset or 0: forked early where fork_workers_early ran.
bool exec_workers() {
  const char* v = std::getenv("FSDPX_EXEC_WORKERS");
  if (!v || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw Error(std::string("FSDPX_EXEC_WORKERS must be 0 (workers forked from the launcher) or 1 (workers started "
                          "by exec), got '") + v + "'");
}

int supervise(const LaunchOptions& o, bool adopt_waiting);

// The arguments the workers forked by fork_workers_early run with (their count first): only a
// launch of these adopts them.
std::vector<std::string>& forked_for() {
  static std::vector<std::string> args;
  return args;
}

std::vector<std::string> launch_key(const LauncherArgs& la) {
  std::vector<std::string> key = la.rest;
  key.insert(key.begin(), std::to_string(la.nproc_per_node));
  return key;
}

}  // namespace

void fork_workers_early(int argc, char** argv, const std::vector<std::string>& no_launch_flags) {
  LauncherArgs la;
  try {
    la = split_launcher_args(argc, argv);
  } catch (const Error&) {
    return;  // launch_if_requested says what is wrong
  }
  if (!launches(la) || !launch_refused(la).empty()) return;
  try {
    if (exec_workers()) return;
  } catch (const Error&) {
    return;  // launch_if_requested refuses the value
  }
  for (const auto& a : la.rest)
    if (std::find(no_launch_flags.begin(), no_launch_flags.end(), a) != no_launch_flags.end()) return;
  forked_for() = launch_key(la);
  fork_waiting_workers(la.nproc_per_node);
}

void exit_process(int code) {
  reap_waiting_workers();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  // A program whose runtime works at exit keeps the normal exit: LeakSanitizer's check (ASan,
  // LSan), gcov's and clang's coverage files. Their symbols come with the program, so a sanitized
  // program linked to an uninstrumented libfsdpx is seen too.
  if (__lsan_do_leak_check || __gcov_dump || __llvm_profile_write_file) std::exit(code);
  ::_exit(code);
}

std::optional<int> launch_if_requested(int argc, char** argv, const std::string& name,
                                       std::vector<std::string>& worker_args, const std::string& on_kill_note) {
  LauncherArgs la = split_launcher_args(argc, argv);
  worker_args.assign(la.rest.begin() + 1, la.rest.end());
  if (!launches(la)) return std::nullopt;
  if (const std::string why = launch_refused(la); !why.empty()) throw Error(why);
  const bool adopt = !exec_workers() && forked_for() == launch_key(la);  // exec_workers refuses a bad value
  LaunchOptions lo;
  lo.nproc = la.nproc_per_node;
  lo.argv = la.rest;
  lo.argv[0] = self_executable();
  lo.name = name;
  lo.on_kill_note = on_kill_note;
  return supervise(lo, adopt);  // the workers forked early run this program with these arguments
}

namespace {

// The launcher's end of the signal pipe: SIGINT and SIGTERM become a byte to read, so the main
// loop sees them between polls. Restores the previous handlers when done.
class SignalPipe {
 public:
  SignalPipe() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("cannot create a pipe: ") + std::strerror(errno));
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalPipe() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
  }
  int fd() const { return g_signal_pipe[0]; }
  // The next signal received, or 0.
  int next() const {
    unsigned char sig = 0;
    return ::read(g_signal_pipe[0], &sig, 1) == 1 ? sig : 0;
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// Worker `r`'s environment: this process's, with torchrun's variables set for it.
std::vector<std::string> worker_environment(const LaunchOptions& o, int r, int port) {
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
  return env;
}

// The launcher's view of the run: the first failure, an interruption, and when to stop waiting
// for workers told to stop.
struct Supervision {
  const LaunchOptions& options;
  WorkerPool& pool;
  int failed_rank = -1, failed_status = 0, interrupted = 0;
  bool stopping = false;
  // After a failed rank, when the others are told to stop. Ranks that fail the same collective
  // check end within microseconds of each other: each says why before it is stopped.
  Clock::time_point term_at{};
  Clock::time_point kill_at{};

  void stop(int sig) {
    pool.signal_all(sig);
    if (!stopping) {
      stopping = true;
      kill_at = Clock::now() + options.grace;
    }
  }
  void on_signal(int sig) {
    if (!interrupted) {
      interrupted = sig;
      std::fprintf(stderr, "%s: got %s; stopping all ranks\n", options.name.c_str(), strsignal(sig));
    }
    stop(SIGTERM);
  }
  void on_exit(const WorkerPool::Worker& w) {
    const bool ok = WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0;
    if (ok || failed_rank >= 0 || interrupted || stopping) return;
    failed_rank = w.rank;
    failed_status = w.status;
    std::fprintf(stderr, "%s: rank %d %s; stopping the other ranks\n", options.name.c_str(), w.rank,
                 how(w.status, options.on_kill_note).c_str());
    term_at = Clock::now() + std::chrono::milliseconds(500);
  }
  void escalate() {
    if (failed_rank >= 0 && !stopping && Clock::now() >= term_at) stop(SIGTERM);
    if (stopping && Clock::now() >= kill_at) {
      pool.signal_all(SIGKILL);
      kill_at = Clock::now() + std::chrono::hours(1);
    }
  }
  int exit_code() const {
    if (interrupted) return 128 + interrupted;
    if (failed_rank < 0) return 0;
    std::fprintf(stderr, "%s: failed: rank %d %s\n", options.name.c_str(), failed_rank,
                 how(failed_status, options.on_kill_note).c_str());
    return code_of(failed_status) ? code_of(failed_status) : 1;
  }
};

}  // namespace

int launch_local(const LaunchOptions& o) { return supervise(o, false); }

namespace {

int supervise(const LaunchOptions& o, bool adopt_waiting) {
  if (o.nproc < 1) throw Error("--nproc-per-node must be at least 1, got " + std::to_string(o.nproc));
  if (o.argv.empty()) throw Error("launch_local: no worker command");
  const int port = o.master_port ? o.master_port : pick_rendezvous_port(o.master_addr);
  SignalPipe signals;
  WorkerPool pool(o.name, o.argv, adopt_waiting);  // on a failed start, its destructor stops those started
  for (int r = 0; r < o.nproc; ++r) pool.start(r, worker_environment(o, r, port));

  Supervision run{o, pool};
  for (;;) {
    pool.relay_output(100, signals.fd());
    while (int sig = signals.next()) run.on_signal(sig);
    for (const WorkerPool::Worker* w : pool.reap()) run.on_exit(*w);
    run.escalate();
    if (!pool.any_running()) {
      pool.drain();
      break;
    }
  }
  return run.exit_code();
}

}  // namespace

}  // namespace fsdpx
