// WorkerPool: the local launcher's workers. Starts each with its own environment and pipes,
// relays their output line by line with a "[rankN]: " prefix, reaps them, and signals them.
//
// A worker starts one of two ways. Forked waiting (fork_waiting_workers, called first thing in
// main while the process holds one thread): a copy of the launcher from before it did anything,
// which waits for its environment and then runs main on, as the program would after an exec,
// without loading LibTorch and registering its operators again (0.15 to 0.21 CPU-s saved net of
// the copied pages, benchmarks/worker_start.sh). Else forked and exec'd: the program from the
// start.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

namespace fsdpx {

class WorkerPool {
 public:
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
    Stream streams[2];  // stdout, stderr
  };

  // `program` is run as is when it contains a '/', else found on PATH (before any fork).
  // Throws fsdpx::Error when it cannot be found. With `adopt_waiting`, start(rank) hands worker
  // `rank` forked by fork_waiting_workers its environment instead of starting a new process:
  // only for `argv` equal to this program's own arguments less --nproc-per-node.
  WorkerPool(const std::string& name, const std::vector<std::string>& argv, bool adopt_waiting = false);
  // Kills and reaps any worker still running; closes the pipes.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts worker `rank` with `env` ("KEY=value" strings, the whole environment): the waiting
  // one, or one forked now that calls only async-signal-safe functions before execve. Throws
  // fsdpx::Error if the pipes or the fork fail.
  void start(int rank, const std::vector<std::string>& env);

  // Waits up to `timeout_ms` for output (or a byte on `wake_fd`, which is not read) and relays it.
  void relay_output(int timeout_ms, int wake_fd);
  // Reaps workers that exited; returns them (each once).
  std::vector<const Worker*> reap();
  // Relays what is left in the pipes without waiting for anything that may still hold them open
  // (a grandchild), then closes them.
  void drain();

  void signal_all(int sig);
  bool any_running() const;

 private:
  void relay(Worker& w, Stream& s, bool flush_all);
  std::string name_;
  std::string path_;  // the resolved program
  std::vector<std::string> argv_;
  pid_t launcher_pid_;
  bool adopt_waiting_;
  std::vector<Worker> workers_;
};

// Forks `n` workers of this program now, without exec, each waiting for WorkerPool::start to
// hand it its environment. In the launcher returns -1 (and forks none when this process holds
// more than one thread: a fork copies only the calling thread, so a lock another thread held
// would stay held in the copy). In a worker returns its rank once it has its environment, its
// stdout and stderr its pipes. Workers never handed an environment are killed and reaped when
// the launcher exits (and die with it, by PR_SET_PDEATHSIG, if it is killed).
int fork_waiting_workers(int n);
// Kills and reaps the workers fork_waiting_workers forked that were never handed an environment
// (the launcher's exit does this too; exit_process, which skips the exit's destructors, calls it).
void reap_waiting_workers();

}  // namespace fsdpx
