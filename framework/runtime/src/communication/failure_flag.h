// The failure flag: set once a collective failed on this rank.
#pragma once

#include <atomic>

namespace fsdpx {

// Set once a collective failed on this rank: the process groups then linger a little before
// tearing down, so that peers still diagnosing can read this rank's heartbeat (and, on rank 0,
// reach the store it serves).
std::atomic<bool>& failure_seen();

}  // namespace fsdpx
