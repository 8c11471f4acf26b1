#include "metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <string>

#include <ATen/ops/empty.h>

#include "fsdpx/framework/runtime/memory_accounting.h"

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

const char* phase_name(StepPhase p) {
  switch (p) {
    case StepPhase::Forward: return "forward";
    case StepPhase::Backward: return "backward";
    case StepPhase::Optimizer: return "optimizer";
  }
  return "step";
}

void PhasePeaks::begin() {
  reset_cpu_peak_memory();
  at_start_ = cpu_memory_stats().allocated;
  for (auto& p : peaks_) p = 0;
}

void PhasePeaks::end(StepPhase phase) {
  int64_t& p = peaks_[static_cast<int>(phase)];
  p = std::max(p, cpu_memory_stats().peak_allocated);
  reset_cpu_peak_memory();
}

int64_t PhasePeaks::step_peak() const { return *std::max_element(std::begin(peaks_), std::end(peaks_)); }

WorldStep gather_step(Communicator& world, const RankStep& mine) {
  constexpr int64_t kFields = 11;
  const int n = world.size();
  at::Tensor local = at::empty({kFields}, at::kDouble);
  double* f = local.data_ptr<double>();
  f[0] = mine.loss_sum;
  f[1] = static_cast<double>(mine.tokens);
  f[2] = static_cast<double>(mine.samples);
  f[3] = static_cast<double>(mine.rss_rise);
  f[4] = static_cast<double>(mine.step_peak);
  f[5] = static_cast<double>(mine.run_peak);
  f[6] = static_cast<double>(mine.allocated.step_peak());
  f[7] = static_cast<double>(mine.allocated_run_peak);
  for (int k = 0; k < kStepPhases; ++k) f[8 + k] = static_cast<double>(mine.allocated.peak(static_cast<StepPhase>(k)));
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
    w.max_allocated_peak = std::max(w.max_allocated_peak, static_cast<int64_t>(a[r * kFields + 6]));
    w.allocated_run_peaks.push_back(static_cast<int64_t>(a[r * kFields + 7]));
    for (int k = 0; k < kStepPhases; ++k)
      w.max_phase_peaks[k] = std::max(w.max_phase_peaks[k], static_cast<int64_t>(a[r * kFields + 8 + k]));
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
