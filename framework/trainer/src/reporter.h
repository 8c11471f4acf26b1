// Rank 0's terminal output: a progress bar redrawn in place on a terminal, or one line per log
// interval; and the run's other lines, which never tear the bar.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace fsdpx {

// What one progress update shows.
struct Progress {
  int64_t step = 0;
  double loss = 0, lr = 0;
  double per_s = 0;          // tokens (or samples) per second
  const char* unit = "tok";  // "tok" or "samples"
  double step_time = 0;      // seconds
  int64_t peak_mem = 0;      // bytes
  double eta = 0;            // seconds
  double ckpt_stall = -1;    // the last checkpoint's stall and write time (seconds), -1 before one
  double ckpt_write = -1;
};

class Reporter {
 public:
  // `bar`: draw on /dev/tty (when it can be opened); `steps`: the run's last step.
  Reporter(bool bar, int64_t steps);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // Redraws the bar; with `log_line`, also prints the step's line (on a terminal only at the end).
  void update(const Progress& p, bool log_line);
  void line(const std::string& text);

 private:
  int64_t steps_;
  std::FILE* tty_ = nullptr;
  bool drawn_ = false;
};

}  // namespace fsdpx
