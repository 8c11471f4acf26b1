#include "reporter.h"

#include <algorithm>
#include <cstring>

#include "format.h"

namespace fsdpx {

Reporter::Reporter(bool bar, int64_t steps) : steps_(steps) {
  if (bar) tty_ = std::fopen("/dev/tty", "w");
}

Reporter::~Reporter() {
  if (tty_) std::fclose(tty_);
}

void Reporter::update(const Progress& p, bool log_line) {
  char stats[256];
  std::snprintf(stats, sizeof stats, "loss %.4f | lr %.2e | %s %s/s | %.3f s/step | peak mem %s | ETA %s", p.loss, p.lr,
                human_count(p.per_s).c_str(), p.unit, p.step_time, human_bytes(static_cast<double>(p.peak_mem)).c_str(),
                duration_text(p.eta).c_str());
  if (p.ckpt_stall >= 0) {
    const size_t n = std::strlen(stats);
    std::snprintf(stats + n, sizeof stats - n, " | ckpt stall %.3f s, write %.2f s", p.ckpt_stall, p.ckpt_write);
  }
  if (tty_) {
    const int width = 24;
    const int filled = static_cast<int>(width * p.step / std::max<int64_t>(steps_, 1));
    std::fprintf(tty_, "\r\033[Kstep %ld/%ld [%s%s] %s", static_cast<long>(p.step), static_cast<long>(steps_),
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(), stats);
    std::fflush(tty_);
    drawn_ = true;
  }
  if (log_line && (!tty_ || p.step == steps_)) {
    if (drawn_) std::fprintf(tty_, "\n");
    drawn_ = false;
    std::printf("step %ld/%ld | %s\n", static_cast<long>(p.step), static_cast<long>(steps_), stats);
  }
}

void Reporter::line(const std::string& text) {
  if (drawn_) std::fprintf(tty_, "\n");
  drawn_ = false;
  std::printf("%s\n", text.c_str());
}

}  // namespace fsdpx
