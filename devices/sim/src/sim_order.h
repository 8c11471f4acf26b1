// The stream-order check of sim (inside the library; the API is in sim.h).
//
// Sim runs every kernel at issue, so a missing event between streams changes no result there. It
// would on a GPU: a kernel on one stream may read memory another stream has not finished writing,
// and memory freed while another stream still uses it may be handed out again. This check finds
// both on sim. Each stream has a vector clock (what it knows to have finished on every stream):
// its own kernels tick it, recording an event copies it, waiting on an event merges the copy, and
// the host learns a stream's clock when it synchronises with it (a blocking copy to the host,
// item(), synchronize). Each block of device memory keeps the last use of every stream:
//   - a kernel on stream t may touch a block only if t knows every other stream's last use of it
//     to have finished;
//   - a block may be freed only if the stream it was allocated on (whose next allocations reuse
//     it, with CUDA's caching allocator) knows that of every other stream, or the host does, or
//     record_stream named that stream.
// Every access is taken as a write: two streams reading one buffer unordered count as a hazard.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace fsdpx::sim {

struct OrderClock;  // an event's copy of its stream's clock

bool order_check_enabled();  // env FSDPX_SIM_STREAM_CHECK (default 1)

// A block of `bytes` at `base` on `device`, allocated on the current stream.
void order_allocated(const void* base, c10::DeviceIndex device, size_t bytes);
// A kernel or copy on the current stream of `device` touches the block at `base`; throws the first
// hazard seen (here or at a free) as a c10::Error.
void order_touched(const void* base, c10::DeviceIndex device);
// The block at `base` is freed (never throws: a free hazard is reported at the next touch or
// allocation).
void order_freed(const void* base) noexcept;
void order_stream_recorded(const void* base, c10::Stream stream);
// The host waits for everything issued so far on `stream`.
void order_host_waits(c10::Stream stream);
void order_host_waits_device(c10::DeviceIndex device);
// Events: a copy of `stream`'s clock (the caller owns it: order_release), a stream waiting on one,
// the host waiting on one.
OrderClock* order_record(c10::Stream stream, OrderClock* previous);
void order_block(const OrderClock* clock, c10::Stream stream);
void order_host_waits(const OrderClock* clock);
void order_release(OrderClock* clock) noexcept;
// Throws the first hazard seen, if any.
void order_throw_pending();

// While one lives on a thread, that thread's device accesses are not uses: the NCCL twin writes a
// collective's result when it is waited for, a use it recorded on its own stream when issued.
class OrderQuiet {
 public:
  OrderQuiet();
  ~OrderQuiet();
  OrderQuiet(const OrderQuiet&) = delete;
  OrderQuiet& operator=(const OrderQuiet&) = delete;
};

}  // namespace fsdpx::sim
