#include "proc_memory.h"

#include <sys/resource.h>

#include <fstream>
#include <string>

namespace fsdpx {

ProcMemory proc_memory() {
  std::ifstream in("/proc/self/status");
  std::string line;
  ProcMemory m;
  while (std::getline(in, line)) {
    if (line.compare(0, 6, "VmRSS:") == 0) m.rss = std::stoll(line.substr(6)) * 1024;
    if (line.compare(0, 6, "VmHWM:") == 0) m.hwm = std::stoll(line.substr(6)) * 1024;
  }
  return m;
}

int64_t minor_page_faults() {
  struct rusage u {};
  if (getrusage(RUSAGE_SELF, &u) != 0) return -1;
  return static_cast<int64_t>(u.ru_minflt);
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

}  // namespace fsdpx
