// WorkerPool: the local launcher's workers. Starts each with its own environment and pipes,
// relays their output line by line with a "[rankN]: " prefix, reaps them, and signals them.
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
  // Throws fsdpx::Error when it cannot be found.
  WorkerPool(const std::string& name, const std::vector<std::string>& argv);
  // Kills and reaps any worker still running; closes the pipes.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Forks worker `rank` with `env` ("KEY=value" strings, the whole environment). The child
  // calls only async-signal-safe functions before execve. Throws fsdpx::Error if the pipes or
  // the fork fail.
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
  std::vector<Worker> workers_;
};

}  // namespace fsdpx
