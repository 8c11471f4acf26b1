// PeerMonitor: every rank bumps a counter in the rendezvous store twice a second; after a failed
// collective, a rank whose counter has stopped is reported as lost. A rank that fails posts its
// message in the store first (report_failure): the diagnosis of the others then names it at once,
// and with `exit_on_peer_failure` the monitor ends its own process within about a second
// instead of leaving it waiting in a collective for the timeout. Uses its own store connection
// and thread.
//
// Watching (for device collectives, which fail by hanging on the device rather than with a
// closed connection): each beat also reads the next rank's counter; a rank that has stopped
// beating for kLostAfter without saying it finished is gone. The watcher posts that as a failure
// (every rank then ends at once with it, naming the rank, its node and host), runs the abort
// hooks (communicators that would otherwise wait out their timeout) and ends its process.
//
// It also carries the flight recorder to the store: with every beat the last few records, when
// they changed; at once, the whole ring, when any rank asks (a rank diagnosing a failure asks).
// The first rank to diagnose a failure compares the ranks' records (flight_recorder.h).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "flight_recorder.h"
#include "fsdpx/topology.h"

namespace fsdpx {

class PeerMonitor {
 public:
  // Connects to the store of `t` and starts beating. Throws what the store's client throws.
  PeerMonitor(const Topology& t, std::chrono::milliseconds timeout, bool exit_on_peer_failure,
              std::shared_ptr<const FlightRecorder> recorder, bool watch = false);
  ~PeerMonitor();
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  // Which of `ranks` failed (with its message, at once) or stopped beating (about two seconds),
  // as a clause for an error message: "hung" when the collective timed out, "gone" otherwise.
  // Unless a rank posted its failure first, the clause ends with the comparison of the ranks'
  // flight records of `group`, made once by the first rank to diagnose, read by the others.
  std::string diagnose(const std::vector<int>& ranks, const std::string& group, bool timed_out) const;
  // Posts this rank's failure for the others; the first failure posted is the one they see.
  void report_failure(const std::string& message) const;
  // Called, in order, before this process ends on a peer's failure (watching).
  void add_abort_hook(std::function<void()> hook);
  static constexpr std::chrono::milliseconds kLostAfter{3000};

 private:
  static std::string key(int r);
  void run();
  // Watching: the next rank's beat; returns the failure to post once it is lost, else "".
  std::string watch_next();
  void run_abort_hooks();  // once: they are dropped as they run
  [[noreturn]] void end_process(const std::string& why);
  // Writes the last `last` records of this rank to the store.
  void publish(size_t last) const;
  // Whether this rank is the first to diagnose a failure, which compares the records.
  bool claim_report() const;
  // The comparison of the ranks' records of `group`, also posted for the other ranks.
  std::string compare_records(const std::vector<int>& ranks, const std::string& group) const;
  // What the first rank to diagnose found (within 3 s), for the others' messages.
  std::string wait_for_report() const;
  std::string whereabouts(const std::vector<int>& ranks) const;
  // "rank R failed: MESSAGE" for a failure another rank posted, else "".
  std::string peer_failure() const;
  int rank_, world_;
  bool exit_on_peer_failure_;
  bool watch_;
  const bool watching_;  // as configured: watch_ ends after the first loss
  int64_t next_beats_ = -1;  // the next rank's counter when last seen moving
  std::chrono::steady_clock::time_point next_moved_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point store_lost_since_{};  // unset while the store answers
  std::vector<std::function<void()>> abort_hooks_;  // under mutex_
  std::shared_ptr<const FlightRecorder> recorder_;
  mutable std::atomic<bool> published_whole_{false};  // then the beats stop publishing the tail
  mutable std::atomic<bool> reporting_{false};        // diagnosing: not ended by another's failure
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace fsdpx
