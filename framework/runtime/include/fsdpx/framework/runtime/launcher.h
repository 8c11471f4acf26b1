// The local launcher: N workers on this machine with torchrun-style variables.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "fsdpx/export.h"

namespace fsdpx {

struct LaunchOptions {
  int nproc = 1;
  // The worker command; argv[0] is the program (an absolute path, or found on PATH).
  std::vector<std::string> argv;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port of this machine
  // How long stopped workers get between SIGTERM and SIGKILL.
  std::chrono::milliseconds grace{5000};
  // Where the launcher's own messages go ("fsdpx-train: rank 1 ..."); the program's name.
  std::string name = "fsdpx";
  // Said after "rank N was killed by signal 9" when the launcher did not send that signal: a
  // SIGKILL from elsewhere is most often the kernel's out-of-memory killer, and the program
  // knows what each rank was planned to hold (e.g. "the plan's peak per rank is 3.2 GiB").
  std::string on_kill_note;
};

// Starts options.nproc workers with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and FSDPX_LAUNCHED=1 set, and relays their output
// line by line with a "[rankN]: " prefix (stdout to stdout, stderr to stderr). SIGINT and
// SIGTERM are passed on to every worker. When a worker exits non-zero or dies, the others get half
// a second to end on their own (ranks that failed the same collective check say so too), then
// SIGTERM, then SIGKILL after the grace period; workers also die with the launcher. Returns
// 0 when every worker succeeded; otherwise the failing worker's exit status (128 + signal if it
// was killed), after saying which rank failed and how; 128 + signal if the launcher was
// interrupted. Throws fsdpx::Error if the workers cannot be started.
FSDPX_API int launch_local(const LaunchOptions& options);

// This executable's absolute path (/proc/self/exe).
FSDPX_API std::string self_executable();

// A TCP port nothing listens on now, for a rendezvous on `addr`: outside the kernel's range of
// ephemeral ports (/proc/sys/net/ipv4/ip_local_port_range), so that no outgoing connection can
// take it before rank 0 binds it (the kernel's own pick, from that range, lost that race under
// parallel tests); the kernel's pick when the range leaves no room. Throws fsdpx::Error.
FSDPX_API int pick_rendezvous_port(const std::string& addr = "127.0.0.1");

// The front of every fsdpx program that can launch itself. If argv has --nproc-per-node N and
// this process is not already a worker (FSDPX_LAUNCHED unset), runs N copies of this program
// with the other arguments and returns the launcher's exit status. Otherwise returns nullopt
// and sets `worker_args` to the arguments without the program name. Throws fsdpx::Error when
// --nproc-per-node is given inside torchrun or an srun step of several tasks (each task would
// start its own job).
// `on_kill_note`: LaunchOptions::on_kill_note.
FSDPX_API std::optional<int> launch_if_requested(int argc, char** argv, const std::string& name,
                                                 std::vector<std::string>& worker_args,
                                                 const std::string& on_kill_note = "");

// The first call in the main of a program that can launch itself, before anything else (the
// process must hold one thread). When launch_if_requested will start N workers (argv has
// --nproc-per-node N, this process is not a worker, FSDPX_EXEC_WORKERS is unset or 0, and none of
// `no_launch_flags` is given: those only skip this early fork), forks them here, as copies of
// this process from before it did anything, each waiting for its environment. Returns in the
// launcher at once; returns in each worker once launch_if_requested, called with the same
// arguments, hands it its environment, and the worker goes on as if the program had been
// started with it (but its /proc/PID/cmdline and /proc/PID/environ still show the launcher's).
// Workers never handed one are killed and reaped when the launcher exits. Saves each worker
// most of LibTorch's start-up (0.15 to 0.21 CPU-s measured, benchmarks/worker_start.sh);
// without this call (or in a process with threads), launch_if_requested forks and execs them.
FSDPX_API void fork_workers_early(int argc, char** argv,
                                  const std::vector<std::string>& no_launch_flags = {"--help", "-h"});

// The end of the main of fsdpx's programs (the hosts, the tools, the test binaries), with main's
// exit code: flushes stdio and the C++ streams, reaps workers forked for a launch that never came,
// and ends the process without the static destructors of the libraries it loaded. LibTorch's
// deregister its operators one by one: about 0.18 CPU-s per process (a 2-rank gpt tiny run, its
// launcher and 2 ranks: 1.23 CPU-s with the teardown, 0.69 without). A program built with
// LeakSanitizer (ASan's too) or coverage exits normally, for their work at exit. Only for the end
// of main: objects main still holds, and objects of static storage, are not destroyed (a static
// TempDir would stay on disk).
[[noreturn]] FSDPX_API void exit_process(int code);

// --nproc-per-node N taken out of argv (the workers get every other argument, so a
// --master-port among them is the workers' to apply).
struct LauncherArgs {
  int nproc_per_node = 0;  // 0: not given
  std::vector<std::string> rest;  // the other arguments, program name first
};
FSDPX_API LauncherArgs split_launcher_args(int argc, char** argv);

}  // namespace fsdpx
