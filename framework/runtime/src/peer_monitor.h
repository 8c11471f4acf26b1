// PeerMonitor: every rank bumps a counter in the rendezvous store twice a second; after a failed
// collective, a rank whose counter has stopped is reported as lost. Uses its own store
// connection and thread.
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
  PeerMonitor(const Topology& t, std::chrono::milliseconds timeout);
  ~PeerMonitor();
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  // Which of `ranks` stopped beating, as a clause for an error message. Takes about two seconds.
  std::string diagnose(const std::vector<int>& ranks) const;

 private:
  static std::string key(int r);
  void run();
  int rank_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace fsdpx
