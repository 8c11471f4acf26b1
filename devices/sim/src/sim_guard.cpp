// Devices, streams, events and the DeviceGuardImplInterface for "sim".
//
// Registered here (static initialisers, run when libfsdpx_sim.so loads):
//   c10::register_privateuse1_backend("sim")   -> "sim:0" parses, prints
//   C10_REGISTER_GUARD_IMPL(PrivateUse1, SimGuardImpl)
//
// Execution model: a sim "kernel" runs to completion on the host thread that
// issues it, so every stream is always idle and every event is complete as
// soon as it is recorded. Streams are therefore only numbers (id 0 = default
// stream, others handed out monotonically, never reused) and events only
// record that they were recorded, on which stream, and when (for
// elapsedTime). What this does NOT model: overlap between streams. Missing
// waits between streams (a kernel on stream B reading data a kernel on stream
// A has "not finished" writing) and memory freed while another stream may
// still use it are found by the stream-order check instead (sim_order.h):
// events carry vector clocks for it.
#include "fsdpx/sim/sim.h"
#include "sim_order.h"

#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>

namespace fsdpx::sim {

namespace {

c10::DeviceIndex read_device_count() {
  const char* env = std::getenv("FSDPX_SIM_DEVICES");
  long n = env ? std::strtol(env, nullptr, 10) : 8;
  if (n < 0) n = 0;
  if (n > kMaxDevices) n = kMaxDevices;
  return static_cast<c10::DeviceIndex>(n);
}

thread_local c10::DeviceIndex tls_device = 0;
// Current stream id per device, per thread (0 = default stream).
thread_local std::array<c10::StreamId, kMaxDevices> tls_stream{};
// Next fresh stream id per device. Ids are never reused: there is nothing to
// release, and distinct ids keep "same stream?" comparisons meaningful.
std::array<std::atomic<c10::StreamId>, kMaxDevices> next_stream_id{};

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  if (index < 0) index = tls_device;
  TORCH_CHECK(index < device_count(), "sim: invalid device index ", int(index),
              " (", int(device_count()), " devices; set FSDPX_SIM_DEVICES)");
  return index;
}

// ----------------------------------------------------------------- events --
struct SimEvent {
  c10::DeviceIndex device = -1;
  c10::StreamId stream = 0;
  bool timing = false;
  std::atomic<bool> recorded{false};
  std::chrono::steady_clock::time_point when{};
  OrderClock* clock = nullptr;  // the stream-order check's copy of its stream's clock
};

}  // namespace

c10::DeviceIndex device_count() noexcept {
  static const c10::DeviceIndex n = read_device_count();
  return n;
}
c10::DeviceIndex current_device() noexcept { return tls_device; }
void set_device(c10::DeviceIndex index) { tls_device = resolve(index); }

c10::Stream get_default_stream(c10::DeviceIndex index) {
  return c10::Stream(c10::Stream::UNSAFE, device(resolve(index)), 0);
}
c10::Stream get_current_stream(c10::DeviceIndex index) {
  index = resolve(index);
  return c10::Stream(c10::Stream::UNSAFE, device(index), tls_stream[index]);
}
void set_current_stream(c10::Stream s) {
  TORCH_CHECK(s.device_type() == c10::DeviceType::PrivateUse1,
              "sim: set_current_stream got a stream of ", s.device());
  tls_stream[resolve(s.device_index())] = s.id();
}
c10::Stream get_new_stream(c10::DeviceIndex index, int /*priority*/) {
  index = resolve(index);
  const c10::StreamId id = 1 + next_stream_id[index].fetch_add(1);
  return c10::Stream(c10::Stream::UNSAFE, device(index), id);
}

namespace {

struct SimGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "sim guard got ", d);
    const auto old = current_device();
    if (d.index() >= 0) set_device(d.index());
    return device(old);
  }
  c10::Device getDevice() const override { return device(current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "sim guard got ", d);
    if (d.index() >= 0) set_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) tls_device = d.index();
  }

  c10::Stream getStream(c10::Device d) const override {
    return get_current_stream(d.index());
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return get_default_stream(d.index());
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return get_new_stream(d.index(), priority);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high) const override {
    return get_new_stream(d.index(), high ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const auto old = get_current_stream(s.device_index());
    set_current_stream(s);
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  c10::DeviceCapability getDeviceCapability(c10::Device) const override {
    return c10::DeviceCapability();  // all dtypes
  }

  // ---- events: complete at record time (see file comment).
  void record(void** event, const c10::Stream& stream,
              const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "sim: event of device ", int(device_index),
                " recorded on a stream of device ", int(stream.device_index()));
    auto* ev = static_cast<SimEvent*>(*event);
    if (ev == nullptr) {
      ev = new SimEvent();
      ev->device = stream.device_index();
      // Like CUDA: PyTorch's default events carry no timing.
      ev->timing = (flag == c10::EventFlag::BACKEND_DEFAULT);
      *event = ev;
    }
    TORCH_CHECK(ev->device == stream.device_index(),
                "sim: an event created on device ", int(ev->device),
                " cannot be recorded on device ", int(stream.device_index()));
    ev->stream = stream.id();
    ev->clock = order_record(stream, ev->clock);
    ev->when = std::chrono::steady_clock::now();
    ev->recorded.store(true, std::memory_order_release);
  }
  // All work issued before the record has already run: nothing to wait for,
  // but the stream-order check learns the ordering.
  void block(void* event, const c10::Stream& stream) const override {
    if (event != nullptr) order_block(static_cast<SimEvent*>(event)->clock, stream);
  }
  bool queryEvent(void* event) const override {
    if (event != nullptr) order_host_waits(static_cast<const OrderClock*>(static_cast<SimEvent*>(event)->clock));
    return true;
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) order_host_waits(static_cast<const OrderClock*>(static_cast<SimEvent*>(event)->clock));
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    auto* ev = static_cast<SimEvent*>(event);
    if (ev != nullptr) order_release(ev->clock);
    delete ev;
  }
  double elapsedTime(void* e1, void* e2, const c10::DeviceIndex) const override {
    auto* a = static_cast<SimEvent*>(e1);
    auto* b = static_cast<SimEvent*>(e2);
    TORCH_CHECK(a && b && a->recorded && b->recorded,
                "sim: both events must be recorded before elapsedTime");
    TORCH_CHECK(a->timing && b->timing,
                "sim: events were created without timing (use "
                "EventFlag::BACKEND_DEFAULT / enable_timing)");
    return std::chrono::duration<double, std::milli>(b->when - a->when).count();
  }

  bool queryStream(const c10::Stream& stream) const override {
    order_host_waits(stream);
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override { order_host_waits(stream); }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    order_host_waits_device(index < 0 ? current_device() : index);
  }
  void recordDataPtrOnStream(const c10::DataPtr& ptr,
                             const c10::Stream& stream) const override {
    allocator()->recordStream(ptr, stream);
  }
};

// Name the backend before anything parses "sim:0".
const bool backend_named = [] {
  c10::register_privateuse1_backend("sim");
  return true;
}();

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, SimGuardImpl)

}  // namespace fsdpx::sim
