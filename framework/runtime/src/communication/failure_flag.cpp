// The failure flag, one per process.
#include "failure_flag.h"

namespace fsdpx {

std::atomic<bool>& failure_seen() {
  static std::atomic<bool> seen{false};
  return seen;
}

}  // namespace fsdpx
