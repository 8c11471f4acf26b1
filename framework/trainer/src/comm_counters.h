// CommCounters: the bytes the engine's counted communicators moved (CountingCommunicator).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdpx/framework/runtime/communicator.h"

namespace fsdpx {

// Bytes moved, summed over the counted communicators.
struct CommTotals {
  int64_t allgather = 0;       // all-gather payloads
  int64_t reduce_scatter = 0;  // reduce-scatter payloads
  int64_t all_reduce = 0;      // all-reduce payloads
  int64_t all_to_all = 0;      // all-to-all payloads
  int64_t sent = 0;            // what this rank sent (ring_sent_bytes)

  CommTotals operator-(const CommTotals& earlier) const;
  CommTotals per(int64_t steps) const;  // each divided by `steps`
  // {"allgather_bytes", "reduce_scatter_bytes", "all_reduce_bytes", "all_to_all_bytes", "sent_bytes"}
  nlohmann::json to_json() const;
};

class CommCounters {
 public:
  void add(std::shared_ptr<CountingCommunicator> c);
  CommTotals totals() const;

 private:
  std::vector<std::shared_ptr<CountingCommunicator>> counters_;
};

}  // namespace fsdpx
