// FlightRecorder: the last collectives of this process (every group), as a ring, so that a hang or
// a failed collective can be explained by comparing the rings of all ranks (NCCL's flight recorder
// for fsdpx's own collectives). Each record: group, sequence number within the group, op, dtype,
// element count, the unit and phase (collective_context.h), and its state.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

namespace fsdpx {

struct FlightEntry {
  std::string group;
  int64_t seq = 0;  // 1, 2, ... per group: the same collective has the same number on every rank
  std::string op, dtype;
  int64_t count = 0;  // elements (all-gather: input; reduce-scatter: output; others: the tensor)
  std::string unit, phase;
  std::string state;  // "issued", "completed", "failed"
  uint64_t id = 0;    // position in this process's ring (not serialised)

  // Same collective as far as the ranks must agree: op, dtype, count, unit and phase.
  bool same_call(const FlightEntry& o) const;
  // "all_gather #57 (unit layers.3, forward, bf16 x 26.7k)"
  std::string describe() const;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 256);
  // Records a collective about to be issued with this thread's phase and unit; returns the
  // record (its id for finish).
  FlightEntry record(const std::string& group, int64_t seq, const char* op, c10::ScalarType dtype, int64_t count);
  void finish(uint64_t id, bool ok);
  // The last `last` records of each group, oldest first, one per line (tab-separated fields).
  std::string serialize(size_t last) const;
  uint64_t version() const;  // changes with every record and state change

 private:
  mutable std::mutex mutex_;
  std::vector<FlightEntry> ring_;
  uint64_t next_ = 0, version_ = 0;
};

// One record as serialize writes it, without the newline.
std::string serialize_entry(const FlightEntry& e);

// Parses what serialize wrote; lines that do not parse are skipped (a record is a diagnosis aid).
std::vector<FlightEntry> parse_flight(const std::string& text);

// One message naming the first divergence between the ranks' records of group `group` (the ranks
// in `ranks`, global numbers; a rank missing from `records` left none): different collectives
// under one sequence number, or ranks that never reached the furthest one; then the last
// completed collective of each rank.
// What compare_flights says when the ranks' records agree to the end.
constexpr const char* kRanksAgree = "every rank agrees up to #";
std::string compare_flights(const std::string& group, const std::vector<int>& ranks,
                            const std::map<int, std::vector<FlightEntry>>& records);

// "" when every rank's call is the same (same_call and sequence number); else which ranks are at
// which call: "rank 1 is at all_gather #57 (...); ranks 0, 2 are at reduce_scatter #57 (...)".
std::string disagreement(const std::map<int, FlightEntry>& calls);

std::string count_text(int64_t n);                // 812, 26.7k, 3.2M

}  // namespace fsdpx
