#include "comm_counters.h"

namespace fsdpx {

CommTotals CommTotals::operator-(const CommTotals& e) const {
  return {allgather - e.allgather, reduce_scatter - e.reduce_scatter, all_reduce - e.all_reduce,
          all_to_all - e.all_to_all, sent - e.sent};
}

CommTotals CommTotals::per(int64_t steps) const {
  return {allgather / steps, reduce_scatter / steps, all_reduce / steps, all_to_all / steps, sent / steps};
}

nlohmann::json CommTotals::to_json() const {
  return {{"allgather_bytes", allgather},
          {"reduce_scatter_bytes", reduce_scatter},
          {"all_reduce_bytes", all_reduce},
          {"all_to_all_bytes", all_to_all},
          {"sent_bytes", sent}};
}

void CommCounters::add(std::shared_ptr<CountingCommunicator> c) {
  if (c) counters_.push_back(std::move(c));
}

CommTotals CommCounters::totals() const {
  CommTotals v;
  for (const auto& c : counters_) {
    const CommStats s = c->stats();
    v.allgather += s[Collective::AllGather].payload_bytes;
    v.reduce_scatter += s[Collective::ReduceScatter].payload_bytes;
    v.all_reduce += s[Collective::AllReduce].payload_bytes;
    v.all_to_all += s[Collective::AllToAll].payload_bytes;
    v.sent += s.sent_bytes();
  }
  return v;
}

}  // namespace fsdpx
