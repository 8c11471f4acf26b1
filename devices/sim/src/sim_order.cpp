// The stream-order check: see sim_order.h.
#include "sim_order.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "fsdpx/sim/sim.h"

namespace fsdpx::sim {

// What a stream (or the host) knows to have finished: per stream, how many of its uses.
struct OrderClock {
  c10::DeviceIndex device = 0;  // whose streams
  std::map<c10::StreamId, uint64_t> seen;
  uint64_t of(c10::StreamId s) const {
    auto it = seen.find(s);
    return it == seen.end() ? 0 : it->second;
  }
  void merge(const OrderClock& other) {
    for (const auto& [s, n] : other.seen) {
      uint64_t& mine = seen[s];
      if (n > mine) mine = n;
    }
  }
};

namespace {

struct DeviceClocks {
  std::map<c10::StreamId, OrderClock> streams;
  OrderClock host;
  // Stream s's clock, which always knows what the host knows (work issued after the host waited
  // runs after what it waited for).
  OrderClock& of(c10::StreamId s) {
    OrderClock& c = streams[s];
    c.merge(host);
    return c;
  }
};

struct BlockUses {
  c10::DeviceIndex device = 0;
  c10::StreamId owner = 0;  // allocated on
  size_t bytes = 0;
  std::map<c10::StreamId, uint64_t> last;  // each stream's last use
  std::unordered_set<c10::StreamId> recorded;  // record_stream
};

struct State {
  std::mutex mu;
  std::array<DeviceClocks, kMaxDevices> devices;
  std::unordered_map<const void*, BlockUses> blocks;
  std::string pending;  // a free's hazard, thrown at the next touch or allocation
  size_t hazards = 0;
  std::string first;
};

State& state() {
  static auto* s = new State();  // leaked: frees may run at exit
  return *s;
}

thread_local int quiet_depth = 0;  // OrderQuiet scopes alive on this thread

std::string stream_text(c10::DeviceIndex d, c10::StreamId s) {
  std::ostringstream o;
  o << "stream " << s << (s == 0 ? " (the default stream)" : "") << " of sim:" << static_cast<int>(d);
  return o.str();
}

// Records a hazard (under the lock); returns its message.
std::string note_hazard(State& st, std::string message) {
  message = "sim stream-order hazard: " + message +
            " (on a GPU this races; FSDPX_SIM_STREAM_CHECK=0 turns the check off)";
  if (st.hazards++ == 0) st.first = message;
  return message;
}

}  // namespace

bool order_check_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("FSDPX_SIM_STREAM_CHECK");
    return env == nullptr || *env == 0 || !(std::strcmp(env, "0") == 0 || std::strcmp(env, "false") == 0);
  }();
  return on;
}

void order_throw_pending() {
  if (!order_check_enabled()) return;
  State& st = state();
  std::string message;
  {
    std::lock_guard<std::mutex> g(st.mu);
    message.swap(st.pending);
  }
  TORCH_CHECK(message.empty(), message);
}

void order_allocated(const void* base, c10::DeviceIndex device, size_t bytes) {
  if (!order_check_enabled()) return;
  order_throw_pending();
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  BlockUses& b = st.blocks[base];
  b = BlockUses{};
  b.device = device;
  b.owner = get_current_stream(device).id();
  b.bytes = bytes;
}

OrderQuiet::OrderQuiet() { ++quiet_depth; }
OrderQuiet::~OrderQuiet() { --quiet_depth; }

void order_touched(const void* base, c10::DeviceIndex device) {
  if (!order_check_enabled() || quiet_depth > 0) return;
  order_throw_pending();
  State& st = state();
  const c10::StreamId t = get_current_stream(device).id();
  std::lock_guard<std::mutex> g(st.mu);
  OrderClock& clock = st.devices[device].of(t);
  const uint64_t n = ++clock.seen[t];
  auto it = st.blocks.find(base);
  if (it == st.blocks.end()) return;
  BlockUses& b = it->second;
  for (const auto& [s, m] : b.last) {
    if (s == t || clock.of(s) >= m) continue;
    std::ostringstream o;
    o << "a kernel on " << stream_text(device, t) << " touches " << b.bytes << " bytes (allocated on stream " << b.owner
      << ") that " << stream_text(device, s)
      << " used last, and waited on no event recorded on that stream after that use";
    const std::string message = note_hazard(st, o.str());
    b.last[t] = n;
    TORCH_CHECK(false, message);
  }
  b.last[t] = n;
}

void order_freed(const void* base) noexcept {
  if (!order_check_enabled()) return;
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  auto it = st.blocks.find(base);
  if (it == st.blocks.end()) return;
  const BlockUses b = std::move(it->second);
  st.blocks.erase(it);
  DeviceClocks& dev = st.devices[b.device];
  const OrderClock& owner = dev.of(b.owner);
  for (const auto& [s, m] : b.last) {
    if (s == b.owner || b.recorded.count(s) || owner.of(s) >= m || dev.host.of(s) >= m) continue;
    std::ostringstream o;
    o << b.bytes << " bytes allocated on " << stream_text(b.device, b.owner) << " are freed while stream " << s
      << " may still use them: stream " << b.owner << " waited on no event of stream " << s
      << " recorded after that use (nor did the host, nor did record_stream name it), and its next allocations "
         "may reuse them";
    const std::string message = note_hazard(st, o.str());
    if (st.pending.empty()) st.pending = message;
    return;
  }
}

void order_stream_recorded(const void* base, c10::Stream stream) {
  if (!order_check_enabled()) return;
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  auto it = st.blocks.find(base);
  if (it != st.blocks.end()) it->second.recorded.insert(stream.id());
}

void order_host_waits(c10::Stream stream) {
  if (!order_check_enabled()) return;
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  DeviceClocks& dev = st.devices[stream.device_index()];
  dev.host.merge(dev.of(stream.id()));
}

void order_host_waits_device(c10::DeviceIndex device) {
  if (!order_check_enabled()) return;
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  DeviceClocks& dev = st.devices[device];
  OrderClock all;
  for (const auto& [s, c] : dev.streams) all.merge(c);
  dev.host.merge(all);
}

OrderClock* order_record(c10::Stream stream, OrderClock* previous) {
  if (!order_check_enabled()) return previous;
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  OrderClock* clock = previous ? previous : new OrderClock();
  *clock = st.devices[stream.device_index()].of(stream.id());
  clock->device = stream.device_index();
  return clock;
}

void order_block(const OrderClock* clock, c10::Stream stream) {
  if (!order_check_enabled() || clock == nullptr) return;
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  st.devices[stream.device_index()].of(stream.id()).merge(*clock);
}

void order_host_waits(const OrderClock* clock) {
  if (!order_check_enabled() || clock == nullptr) return;
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  st.devices[clock->device].host.merge(*clock);
}

void order_release(OrderClock* clock) noexcept { delete clock; }

size_t stream_hazards() {
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  return st.hazards;
}

std::string first_stream_hazard() {
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  return st.first;
}

std::string stream_report() {
  State& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  std::ostringstream o;
  for (size_t d = 0; d < st.devices.size(); ++d)
    for (const auto& [s, clock] : st.devices[d].streams)
      if (clock.of(s) > 0) o << "sim:" << d << " stream " << s << " uses " << clock.of(s) << "\n";
  o << "hazards " << st.hazards << "\n";
  return o.str();
}

}  // namespace fsdpx::sim

// For code that loads the library with dlopen (fsdpx's own tools): stream_report() by a C name.
extern "C" FSDPX_SIM_API const char* fsdpx_sim_stream_report() {
  static thread_local std::string report;
  report = fsdpx::sim::stream_report();
  return report.c_str();
}

