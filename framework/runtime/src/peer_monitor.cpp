#include "peer_monitor.h"

#include "diagnostics.h"

namespace fsdpx {

PeerMonitor::PeerMonitor(const Topology& t, std::chrono::milliseconds timeout) : rank_(t.rank) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(t.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  store_ = c10::make_intrusive<c10d::TCPStore>(t.master_addr, o);
  thread_ = std::thread([this] { run(); });
}

PeerMonitor::~PeerMonitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string PeerMonitor::diagnose(const std::vector<int>& ranks) const {
  try {
    std::vector<int64_t> before;
    for (int r : ranks) before.push_back(store_->add(key(r), 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    std::vector<int> lost;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] != rank_ && store_->add(key(ranks[i]), 0) == before[i]) lost.push_back(ranks[i]);
    }
    if (lost.empty()) return "every peer is still alive, so it was a timeout or a network fault";
    return std::string(lost.size() == 1 ? "rank " : "ranks ") + join_ints(lost) + (lost.size() == 1 ? " is" : " are") +
           " gone (no heartbeat for 2 s)";
  } catch (const std::exception&) {
    return "rank 0, which hosts the rendezvous store, is gone";
  }
}

std::string PeerMonitor::key(int r) { return "fsdpx/heartbeat/" + std::to_string(r); }

void PeerMonitor::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    lock.unlock();
    try {
      store_->add(key(rank_), 1);
    } catch (const std::exception&) {
      // The store may be gone (diagnose() will say so) or briefly unreachable: keep trying.
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; });
  }
}

}  // namespace fsdpx
