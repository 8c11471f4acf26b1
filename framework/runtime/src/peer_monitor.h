// PeerMonitor: every rank bumps a counter in the rendezvous store twice a second; after a failed
// collective, a rank whose counter has stopped is reported as lost. A rank that fails posts its
// message in the store first (report_failure): the diagnosis of the others then names it at once,
// and with `exit_on_peer_failure` the monitor ends its own process within about a second
// instead of leaving it waiting in a collective for the timeout. Uses its own store connection
// and thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "fsdpx/topology.h"

namespace fsdpx {

class PeerMonitor {
 public:
  // Connects to the store of `t` and starts beating. Throws what the store's client throws.
  PeerMonitor(const Topology& t, std::chrono::milliseconds timeout, bool exit_on_peer_failure);
  ~PeerMonitor();
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  // Which of `ranks` failed (with its message, at once) or stopped beating (about two seconds),
  // as a clause for an error message.
  std::string diagnose(const std::vector<int>& ranks) const;
  // Posts this rank's failure for the others; the first failure posted is the one they see.
  void report_failure(const std::string& message) const;

 private:
  static std::string key(int r);
  void run();
  // "rank R failed: MESSAGE" for a failure another rank posted, else "".
  std::string peer_failure() const;
  int rank_;
  bool exit_on_peer_failure_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace fsdpx
