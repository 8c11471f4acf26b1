#include "peer_monitor.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "message_text.h"

namespace fsdpx {

namespace {
constexpr const char* kFailureKey = "fsdpx/failure";  // "R\nmessage" of the first rank that failed
constexpr const char* kFlightRequest = "fsdpx/flight/request";    // a counter: > 0 asks for whole rings
constexpr const char* kFlightReporter = "fsdpx/flight/reporter";  // the rank that compares them
constexpr const char* kFlightReport = "fsdpx/flight/report";      // and what it found
constexpr size_t kTailRecords = 8;  // per group, what every beat publishes (a stopped rank's last word)
std::string flight_key(int r) { return "fsdpx/flight/" + std::to_string(r); }
}  // namespace

PeerMonitor::PeerMonitor(const Topology& t, std::chrono::milliseconds timeout, bool exit_on_peer_failure,
                         std::shared_ptr<const FlightRecorder> recorder, bool watch)
    : rank_(t.rank),
      world_(t.world_size),
      exit_on_peer_failure_(exit_on_peer_failure),
      watch_(watch && t.world_size > 1),
      watching_(watch_),
      recorder_(std::move(recorder)) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(t.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  store_ = c10::make_intrusive<c10d::TCPStore>(t.master_addr, o);
  thread_ = std::thread([this] { run(); });
}

PeerMonitor::~PeerMonitor() {
  try {  // a rank that ends normally is not lost to its watcher
    store_->set(key(rank_) + "/done", std::vector<uint8_t>{1});
  } catch (const std::exception&) {
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

// Watches every rank's counter for up to 2 s, a read every 250 ms. Rank 0 hosts the store and
// may end (after its own diagnosis) while this one watches: what was seen until then counts, as
// long as it spans at least one second (two beats).
std::string PeerMonitor::diagnose(const std::vector<int>& ranks, const std::string& group, bool timed_out) const {
  using Clock = std::chrono::steady_clock;
  auto read = [&] {
    std::vector<int64_t> v;
    for (int r : ranks) v.push_back(store_->add(key(r), 0));
    return v;
  };
  std::vector<int64_t> first, last;
  const auto start = Clock::now();
  auto seen_until = start;
  bool store_lost = false, reporter = false;
  try {
    if (std::string failed = peer_failure(); !failed.empty()) return failed;
    publish(SIZE_MAX);
    store_->add(kFlightRequest, 1);
    reporting_.store(true);  // not ended by another rank's failure before this diagnosis is done
    reporter = claim_report();
    first = last = read();
  } catch (const std::exception&) {
    reporting_.store(false);
    return "rank 0, which hosts the rendezvous store, is gone";
  }
  while (Clock::now() - start < std::chrono::milliseconds(2000)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    try {
      last = read();
      seen_until = Clock::now();
    } catch (const std::exception&) {
      store_lost = true;
      break;
    }
  }
  const double watched = std::chrono::duration<double>(seen_until - start).count();
  if (store_lost && watched < 1.0) return "rank 0, which hosts the rendezvous store, is gone";
  std::vector<int> lost;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] != rank_ && last[i] == first[i]) lost.push_back(ranks[i]);
  std::string clause;
  if (lost.empty()) {
    clause = store_lost ? "rank 0, which hosts the rendezvous store, is gone" : "every peer is still alive";
  } else {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", watched);
    clause = std::string(lost.size() == 1 ? "rank " : "ranks ") + join_ints(lost) +
             (lost.size() == 1 ? " is" : " are") +
             (timed_out ? " hung (no heartbeat in " + std::string(secs) + " s, its connections still open)"
                        : " gone (no heartbeat in " + std::string(secs) + " s)");
    if (!store_lost) clause += whereabouts(lost);
  }
  std::string records;
  try {
    if (!store_lost) records = reporter ? compare_records(ranks, group) : wait_for_report();
  } catch (const std::exception&) {
    // The store went away while reading: the clause above is what is known.
  }
  reporting_.store(false);
  // With every peer alive and in step, the collective itself stalled.
  if (lost.empty() && !store_lost && (records.empty() || records.find(kRanksAgree) != std::string::npos))
    clause += ", so it was a timeout or a network fault";
  return records.empty() ? clause : clause + "; " + records;
}

// " (node 1, host n1: ranks 2 pid 71, 3 pid 72; ...)" from the ranks' join records ("host pid
// node"). Empty if the records cannot be read.
std::string PeerMonitor::whereabouts(const std::vector<int>& ranks) const {
  std::map<std::pair<int, std::string>, std::vector<std::string>> by_node;  // (node, host) -> "r pid p"
  try {
    for (int r : ranks) {
      const std::vector<uint8_t> v = store_->get("fsdpx/join/" + std::to_string(r));
      std::istringstream in(std::string(v.begin(), v.end()));
      std::string host;
      long pid = 0;
      int node = 0;
      if (!(in >> host >> pid >> node)) return "";
      by_node[{node, host}].push_back(std::to_string(r) + " pid " + std::to_string(pid));
    }
  } catch (const std::exception&) {
    return "";
  }
  std::string out;
  for (const auto& [where, rs] : by_node) {
    out += std::string(out.empty() ? " (" : "; ") + "node " + std::to_string(where.first) + ", host " + where.second +
           ": rank";
    out += rs.size() == 1 ? " " : "s ";
    for (size_t i = 0; i < rs.size(); ++i) out += (i ? ", " : "") + rs[i];
  }
  return out.empty() ? "" : out + ")";
}

void PeerMonitor::publish(size_t last) const {
  if (!recorder_) return;
  const std::string text = recorder_->serialize(last);
  store_->set(flight_key(rank_), std::vector<uint8_t>(text.begin(), text.end()));
  if (last == SIZE_MAX) published_whole_.store(true);
}

bool PeerMonitor::claim_report() const {
  const std::string me = std::to_string(rank_);
  const std::vector<uint8_t> who = store_->compareSet(kFlightReporter, {}, std::vector<uint8_t>(me.begin(), me.end()));
  return std::string(who.begin(), who.end()) == me;
}

std::string PeerMonitor::wait_for_report() const {
  store_->wait({kFlightReport}, std::chrono::milliseconds(3000));
  const std::vector<uint8_t> v = store_->get(kFlightReport);
  return std::string(v.begin(), v.end());
}

std::string PeerMonitor::compare_records(const std::vector<int>& ranks, const std::string& group) const {
  std::map<int, std::vector<FlightEntry>> records;
  for (int r : ranks) {
    if (!store_->check({flight_key(r)})) continue;
    const std::vector<uint8_t> v = store_->get(flight_key(r));
    records[r] = parse_flight(std::string(v.begin(), v.end()));
  }
  const std::string report = compare_flights(group, ranks, records);
  store_->set(kFlightReport, std::vector<uint8_t>(report.begin(), report.end()));
  return report;
}

std::string PeerMonitor::key(int r) { return "fsdpx/heartbeat/" + std::to_string(r); }

void PeerMonitor::report_failure(const std::string& message) const {
  try {
    const std::string text = std::to_string(rank_) + "\n" + message;
    store_->compareSet(kFailureKey, {}, std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
    // The store is gone with rank 0: the others learn of this rank's end from the lost heartbeat.
  }
}

std::string PeerMonitor::peer_failure() const {
  if (!store_->check({kFailureKey})) return "";
  const std::vector<uint8_t> v = store_->get(kFailureKey);
  const std::string text(v.begin(), v.end());
  const size_t nl = text.find('\n');
  const std::string rank = text.substr(0, nl), message = nl == std::string::npos ? "" : text.substr(nl + 1);
  if (rank == std::to_string(rank_)) return "";
  return "rank " + rank + " failed: " + message;
}

void PeerMonitor::add_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  abort_hooks_.push_back(std::move(hook));
}

std::string PeerMonitor::watch_next() {
  const int next = (rank_ + 1) % world_;
  const int64_t beats = store_->add(key(next), 0);
  const auto now = std::chrono::steady_clock::now();
  if (beats != next_beats_) {
    next_beats_ = beats;
    next_moved_ = now;
    return "";
  }
  if (now - next_moved_ < kLostAfter || store_->check({key(next) + "/done"})) return "";
  const double secs = std::chrono::duration<double>(now - next_moved_).count();
  char text[64];
  std::snprintf(text, sizeof text, "%.1f", secs);
  return "rank " + std::to_string(next) + " is gone (no heartbeat in " + text + " s, seen by rank " +
         std::to_string(rank_) + ")" + whereabouts({next});
}

void PeerMonitor::run_abort_hooks() {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    hooks.swap(abort_hooks_);
  }
  for (auto& h : hooks) {
    try {
      h();
    } catch (...) {
    }
  }
}

void PeerMonitor::end_process(const std::string& why) {
  std::fprintf(stderr, "fsdpx: stopping rank %d: %s\n", rank_, why.c_str());
  std::fflush(stderr);
  run_abort_hooks();
  // Rank 0 hosts the store: with watchers, a third rank reads the failure from it within two beats
  // instead of taking the store's end for rank 0's loss. Without them (Gloo) nothing waits on it.
  if (rank_ == 0 && watching_ && world_ > 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::_Exit(1);
}

void PeerMonitor::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  int seen = 0;  // beats since another rank's failure was first seen
  uint64_t published = 0;
  while (!stop_) {
    lock.unlock();
    try {
      store_->add(key(rank_), 1);
      if (recorder_ && !published_whole_.load()) {
        if (store_->add(kFlightRequest, 0) > 0) {
          publish(SIZE_MAX);
        } else if (const uint64_t v = recorder_->version(); v != published) {
          publish(kTailRecords);
          published = v;
        }
      }
      const std::string failed = exit_on_peer_failure_ ? peer_failure() : "";
      // One beat of grace: when every rank fails alike, each ends with its own message first.
      if (!failed.empty() && ++seen >= 2 && !reporting_.load()) end_process(failed);
      if (watch_ && failed.empty()) {
        if (const std::string lost = watch_next(); !lost.empty()) {
          report_failure(lost);
          if (exit_on_peer_failure_) end_process(lost);
          run_abort_hooks();  // the collectives waiting for the lost rank fail now, not at their timeout
          watch_ = false;
        }
      }
      store_lost_since_ = std::chrono::steady_clock::time_point{};
    } catch (const std::exception&) {
      // The store may be gone (diagnose() will say so) or briefly unreachable: keep trying. A
      // watching rank takes it for rank 0's end once it stays away for kLostAfter.
      const auto now = std::chrono::steady_clock::now();
      if (store_lost_since_ == std::chrono::steady_clock::time_point{}) store_lost_since_ = now;
      if (watch_ && exit_on_peer_failure_ && now - store_lost_since_ >= kLostAfter)
        end_process("rank 0, which hosts the rendezvous store, is gone");
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; });
  }
}

}  // namespace fsdpx
