// The process's memory as the kernel reports it (RSS), beside the allocated bytes that
// memory_accounting.h counts.
#pragma once

#include <cstdint>

namespace fsdpx {

// VmRSS and VmHWM of this process in bytes; -1 when /proc cannot tell.
struct ProcMemory {
  int64_t rss = -1, hwm = -1;
};
ProcMemory proc_memory();
// The peak RSS of the process so far (getrusage), in bytes.
int64_t peak_rss_bytes();
// The minor page faults of the process so far (getrusage: every thread's): a page touched for the
// first time since the system gave it, e.g. memory freed to the system and allocated again.
int64_t minor_page_faults();
// Restarts VmHWM from the current RSS (Linux: "5" to /proc/self/clear_refs), so that the peak of
// one step can be read after it. False when the system does not allow it.
bool reset_peak_rss();

}  // namespace fsdpx
