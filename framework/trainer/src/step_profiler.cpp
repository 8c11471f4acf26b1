#include "step_profiler.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "fsdpx/error.h"

namespace fsdpx {
namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

struct Total {
  int64_t calls = 0;
  double seconds = 0;
};

// Each CPU operator's time less its callees' (operators nested inside it on the same thread).
std::map<std::string, Total> self_times(const std::vector<prof::KinetoEvent>& events) {
  std::vector<const prof::KinetoEvent*> ops;
  for (const auto& e : events)
    if (e.deviceType() == c10::DeviceType::CPU && e.endNs() > e.startNs()) ops.push_back(&e);
  std::sort(ops.begin(), ops.end(), [](const prof::KinetoEvent* a, const prof::KinetoEvent* b) {
    if (a->startThreadId() != b->startThreadId()) return a->startThreadId() < b->startThreadId();
    return a->startNs() != b->startNs() ? a->startNs() < b->startNs() : a->endNs() > b->endNs();
  });
  std::map<std::string, Total> totals;
  std::vector<std::pair<const prof::KinetoEvent*, double>> open;  // the enclosing operators, their self time
  auto close_until = [&](uint64_t thread, uint64_t at) {
    while (!open.empty() && (open.back().first->startThreadId() != thread || open.back().first->endNs() <= at)) {
      Total& t = totals[open.back().first->name()];
      t.calls += 1;
      t.seconds += open.back().second;
      open.pop_back();
    }
  };
  for (const prof::KinetoEvent* e : ops) {
    close_until(e->startThreadId(), e->startNs());
    const double d = static_cast<double>(e->durationNs()) / 1e9;
    if (!open.empty()) open.back().second -= d;
    open.emplace_back(e, d);
  }
  close_until(~uint64_t{0}, ~uint64_t{0});
  return totals;
}

std::map<std::string, Total> kernel_times(const std::vector<prof::KinetoEvent>& events) {
  std::map<std::string, Total> totals;
  for (const auto& e : events) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    Total& t = totals[e.name()];
    t.calls += 1;
    t.seconds += static_cast<double>(e.durationNs()) / 1e9;
  }
  return totals;
}

}  // namespace

void StepProfiler::start(bool cuda) {
  cuda_ = cuda;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  running_ = true;
}

nlohmann::json StepProfiler::stop(size_t top) {
  if (!running_) throw Error("StepProfiler::stop without start");
  running_ = false;
  const std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  const std::map<std::string, Total> totals = cuda_ ? kernel_times(result->events()) : self_times(result->events());
  std::vector<std::pair<std::string, Total>> sorted(totals.begin(), totals.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0;
  for (const auto& [name, t] : sorted) total += t.seconds;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < sorted.size() && i < top; ++i)
    rows.push_back({{"name", sorted[i].first},
                    {"calls", sorted[i].second.calls},
                    {"seconds", sorted[i].second.seconds},
                    {"share", total > 0 ? sorted[i].second.seconds / total : 0.0}});
  return {{"what", cuda_ ? "cuda kernels, by device time" : "cpu operators, by self time"},
          {"total_s", total},
          {"top", rows}};
}

std::string StepProfiler::summary_line(const nlohmann::json& p, int64_t step) {
  std::string line = "profile of step " + std::to_string(step) + " (" + p["what"].get<std::string>() + "):";
  for (size_t i = 0; i < p["top"].size() && i < 3; ++i) {
    char part[200];
    std::snprintf(part, sizeof part, "%s %s %.1f ms (%.0f%%)", i ? "," : "",
                  p["top"][i]["name"].get<std::string>().substr(0, 80).c_str(),
                  p["top"][i]["seconds"].get<double>() * 1e3, 100 * p["top"][i]["share"].get<double>());
    line += part;
  }
  return line;
}

}  // namespace fsdpx
