#include "metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <string>

#include <ATen/ops/empty.h>

namespace fsdpx {

ProcMemory proc_memory() {
  std::ifstream in("/proc/self/status");
  std::string line;
  ProcMemory m;
  while (std::getline(in, line)) {
    if (line.compare(0, 6, "VmRSS:") == 0) m.rss = std::stoll(line.substr(6)) * 1024;
    if (line.compare(0, 6, "VmHWM:") == 0) m.hwm = std::stoll(line.substr(6)) * 1024;
  }
  return m;
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

WorldStep gather_step(Communicator& world, const RankStep& mine) {
  constexpr int64_t kFields = 6;
  const int n = world.size();
  at::Tensor local = at::empty({kFields}, at::kDouble);
  double* f = local.data_ptr<double>();
  f[0] = mine.loss_sum;
  f[1] = static_cast<double>(mine.tokens);
  f[2] = static_cast<double>(mine.samples);
  f[3] = static_cast<double>(mine.rss_rise);
  f[4] = static_cast<double>(mine.step_peak);
  f[5] = static_cast<double>(mine.run_peak);
  at::Tensor all = at::empty({n * kFields}, at::kDouble);
  world.all_gather(all, local).wait();
  const double* a = all.data_ptr<double>();
  WorldStep w;
  double loss = 0, tokens = 0, samples = 0, rise = -1, peak = 0;
  for (int r = 0; r < n; ++r) {  // in rank order: the same result on every rank
    loss += a[r * kFields];
    tokens += a[r * kFields + 1];
    samples += a[r * kFields + 2];
    rise = std::max(rise, a[r * kFields + 3]);
    peak = std::max(peak, a[r * kFields + 4]);
    w.run_peaks.push_back(static_cast<int64_t>(a[r * kFields + 5]));
  }
  w.loss = loss / n;
  w.tokens = static_cast<int64_t>(tokens);
  w.samples = static_cast<int64_t>(samples);
  w.max_rss_rise = static_cast<int64_t>(rise);
  w.max_step_peak = static_cast<int64_t>(peak);
  return w;
}

void CommCounters::add(std::shared_ptr<CountingCommunicator> c) {
  if (c) counters_.push_back(std::move(c));
}

CommTotals CommCounters::totals() const {
  CommTotals v{};
  for (const auto& c : counters_) {
    const CommStats s = c->stats();
    v[0] += s[Collective::AllGather].payload_bytes;
    v[1] += s[Collective::ReduceScatter].payload_bytes;
    v[2] += s[Collective::AllReduce].payload_bytes;
    v[3] += s.sent_bytes();
    v[4] += s[Collective::AllToAll].payload_bytes;
  }
  return v;
}

}  // namespace fsdpx
