#include "flight_recorder.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "fsdpx/framework/base/dtype_name.h"
#include "fsdpx/framework/runtime/collective_context.h"
#include "message_text.h"

namespace fsdpx {

// ---- Records -----------------------------------------------------------------------------------

std::string count_text(int64_t n) {
  char b[32];
  if (n < 1000) return std::to_string(n);
  if (n < 1000000) std::snprintf(b, sizeof b, "%.1fk", static_cast<double>(n) / 1e3);
  else if (n < 1000000000) std::snprintf(b, sizeof b, "%.1fM", static_cast<double>(n) / 1e6);
  else std::snprintf(b, sizeof b, "%.1fG", static_cast<double>(n) / 1e9);
  return b;
}

bool FlightEntry::same_call(const FlightEntry& o) const {
  return op == o.op && dtype == o.dtype && count == o.count && unit == o.unit && phase == o.phase;
}

std::string FlightEntry::describe() const {
  std::string what = op + " #" + std::to_string(seq) + " (";
  if (!unit.empty()) what += "unit " + unit + ", ";
  what += phase;
  if (op != "barrier") what += ", " + dtype + " x " + count_text(count);
  return what + ")";
}

FlightRecorder::FlightRecorder(size_t capacity) : ring_(std::max<size_t>(capacity, 1)) {}

FlightEntry FlightRecorder::record(const std::string& group, int64_t seq, const char* op, c10::ScalarType dtype,
                                int64_t count) {
  FlightEntry e;
  e.group = group;
  e.seq = seq;
  e.op = op;
  e.dtype = dtype_name(dtype);
  e.count = count;
  e.unit = CollectiveUnit::current();
  e.phase = CollectivePhase::current();
  e.state = "issued";
  std::lock_guard<std::mutex> lock(mutex_);
  e.id = next_++;
  ring_[e.id % ring_.size()] = e;
  ++version_;
  return e;
}

std::string serialize_entry(const FlightEntry& e) {
  return e.group + "\t" + std::to_string(e.seq) + "\t" + e.op + "\t" + e.dtype + "\t" + std::to_string(e.count) + "\t" +
         e.unit + "\t" + e.phase + "\t" + e.state;
}

void FlightRecorder::finish(uint64_t id, bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  FlightEntry& e = ring_[id % ring_.size()];
  if (e.id != id || id >= next_) return;  // already overwritten
  e.state = ok ? "completed" : "failed";
  ++version_;
}

std::string FlightRecorder::serialize(size_t last) const {
  std::lock_guard<std::mutex> lock(mutex_);
  // Per group: a rank stopped while its control group waits must still say where that group was,
  // however many records the engine's group made since.
  const uint64_t n = std::min<uint64_t>(next_, ring_.size());
  std::map<std::string, size_t> kept;
  std::vector<uint64_t> ids;
  for (uint64_t id = next_; id-- > next_ - n;)
    if (kept[ring_[id % ring_.size()].group]++ < last) ids.push_back(id);
  std::string out;
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) out += serialize_entry(ring_[*it % ring_.size()]) + "\n";
  return out;
}

uint64_t FlightRecorder::version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return version_;
}

std::vector<FlightEntry> parse_flight(const std::string& text) {
  std::vector<FlightEntry> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> f;
    size_t start = 0;
    for (size_t tab; (tab = line.find('\t', start)) != std::string::npos; start = tab + 1)
      f.push_back(line.substr(start, tab - start));
    f.push_back(line.substr(start));
    if (f.size() != 8) continue;
    FlightEntry e;
    try {
      e.seq = std::stoll(f[1]);
      e.count = std::stoll(f[4]);
    } catch (const std::exception&) {
      continue;
    }
    e.group = f[0];
    e.op = f[2];
    e.dtype = f[3];
    e.unit = f[5];
    e.phase = f[6];
    e.state = f[7];
    out.push_back(std::move(e));
  }
  return out;
}

// ---- Comparing the ranks' records ----------------------------------------------------------------

namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  return std::string(ranks.size() == 1 ? "rank " : "ranks ") + join_ints(ranks);
}

const FlightEntry* at_seq(const std::vector<FlightEntry>& v, int64_t seq) {
  auto it = std::lower_bound(v.begin(), v.end(), seq, [](const FlightEntry& e, int64_t s) { return e.seq < s; });
  return it != v.end() && it->seq == seq ? &*it : nullptr;
}

// Ranks grouped by what `pick` gives them (same call and state), in order of the first rank.
template <class Pick>
std::vector<std::pair<const FlightEntry*, std::vector<int>>> clusters(
    const std::map<int, std::vector<FlightEntry>>& by_rank, Pick pick) {
  std::vector<std::pair<const FlightEntry*, std::vector<int>>> out;
  for (const auto& [rank, entries] : by_rank) {
    const FlightEntry* e = pick(entries);
    if (!e) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& c) {
      return c.first->seq == e->seq && c.first->same_call(*e) && c.first->state == e->state;
    });
    if (it == out.end()) out.push_back({e, {rank}});
    else it->second.push_back(rank);
  }
  return out;
}

std::string where(const FlightEntry& e, const std::vector<int>& ranks) {
  const bool one = ranks.size() == 1;
  if (e.state == "completed") return ranks_text(ranks) + " ran " + e.describe();
  return ranks_text(ranks) + (one ? " is at " : " are at ") + e.describe() + (e.state == "failed" ? ", failed" : "");
}

std::string join_clusters(const std::vector<std::pair<const FlightEntry*, std::vector<int>>>& cs) {
  std::string out;
  for (const auto& [e, ranks] : cs) out += (out.empty() ? "" : "; ") + where(*e, ranks);
  return out;
}

}  // namespace

std::string disagreement(const std::map<int, FlightEntry>& calls) {
  std::map<int, std::vector<FlightEntry>> by_rank;
  for (const auto& [r, e] : calls) by_rank[r] = {e};
  auto cs = clusters(by_rank, [](const std::vector<FlightEntry>& v) { return &v.front(); });
  bool differ = false;
  for (const auto& c : cs)
    differ = differ || !c.first->same_call(*cs.front().first) || c.first->seq != cs.front().first->seq;
  return differ ? join_clusters(cs) : "";
}

std::string compare_flights(const std::string& group, const std::vector<int>& ranks,
                            const std::map<int, std::vector<FlightEntry>>& records) {
  std::map<int, std::vector<FlightEntry>> by_rank;
  std::vector<int> missing;
  for (int r : ranks) {
    auto it = records.find(r);
    std::vector<FlightEntry> mine;
    if (it != records.end())
      for (const FlightEntry& e : it->second)
        if (e.group == group) mine.push_back(e);
    std::stable_sort(mine.begin(), mine.end(),
                     [](const FlightEntry& a, const FlightEntry& b) { return a.seq < b.seq; });
    if (mine.empty()) missing.push_back(r);
    else by_rank[r] = std::move(mine);
  }
  std::string msg = "flight records of group '" + group + "': ";
  if (by_rank.empty()) return msg + "no rank left one";
  int64_t lo = 0, hi = INT64_MAX, furthest = 0;
  for (const auto& [r, v] : by_rank) {
    lo = std::max(lo, v.front().seq);
    hi = std::min(hi, v.back().seq);
    furthest = std::max(furthest, v.back().seq);
  }
  bool diverged = false;
  for (int64_t s = lo; s <= hi && !diverged; ++s) {
    auto cs = clusters(by_rank, [&](const std::vector<FlightEntry>& v) { return at_seq(v, s); });
    bool differ = false;
    for (const auto& c : cs) differ = differ || !c.first->same_call(*cs.front().first);
    if (!differ) continue;
    diverged = true;
    msg += "the ranks diverge at #" + std::to_string(s) + ": " + join_clusters(cs);
  }
  if (!diverged) {
    // A collective completes on a rank only once every rank took part (a broadcast's root aside):
    // a record that ends before the furthest completed one is stale (a stopped rank publishes
    // it with its heartbeat).
    int64_t completed = 0;
    for (const auto& [r, v] : by_rank)
      for (const FlightEntry& e : v)
        if (e.state == "completed" && e.op != "broadcast") completed = std::max(completed, e.seq);
    auto last = [](const std::vector<FlightEntry>& v) { return &v.back(); };
    std::string behind;
    for (const auto& [e, rs] : clusters(by_rank, last))
      if (e->seq < furthest)
        behind += (behind.empty() ? "" : "; ") + ranks_text(rs) + " never reached #" + std::to_string(furthest) +
                  " (last recorded: " + e->describe() + ", " + e->state +
                  (e->seq < completed ? "; a record from its last heartbeat: it took part in #" +
                                            std::to_string(completed) + ", which the others completed"
                                      : "") +
                  ")";
    std::string ahead;
    for (const auto& [e, rs] : clusters(by_rank, last))
      if (e->seq == furthest) ahead += (ahead.empty() ? "" : "; ") + where(*e, rs);
    msg += behind.empty() ? kRanksAgree + std::to_string(furthest) + "; " + ahead : behind + "; " + ahead;
  }
  if (!missing.empty()) msg += "; " + ranks_text(missing) + " left no record";
  std::string done;
  auto last_completed = [](const std::vector<FlightEntry>& v) -> const FlightEntry* {
    for (auto it = v.rbegin(); it != v.rend(); ++it)
      if (it->state == "completed") return &*it;
    return nullptr;
  };
  for (const auto& [e, rs] : clusters(by_rank, last_completed))
    done += (done.empty() ? "" : "; ") + ranks_text(rs) + ": " + e->describe();
  if (!done.empty()) msg += ". Last completed: " + done;
  std::string now;  // where each rank stopped, when that is not a completed collective
  for (const auto& [e, rs] : clusters(by_rank, [](const std::vector<FlightEntry>& v) { return &v.back(); }))
    if (e->state != "completed") now += (now.empty() ? "" : "; ") + where(*e, rs);
  if (diverged && !now.empty()) msg += ". Now: " + now;
  return msg;
}

}  // namespace fsdpx
