// sim's NCCL twin: see fsdpx/sim/sim_nccl.h.
#include "fsdpx/sim/sim_nccl.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <deque>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "fsdpx/sim/sim.h"
#include "sim_order.h"

namespace fsdpx::sim {
namespace {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using HostWorks = std::vector<WorkPtr>;

// What a collective is, as the ranks of a group compare it before it runs.
struct Call {
  enum Kind : int64_t { Broadcast = 1, AllReduce, AllGather, ReduceScatter, AllToAll, Barrier };
  static constexpr int kFields = 6;
  int64_t kind = 0, dtype = -1, in = 0, out = 0, op = -1, root = -1;

  static const char* name(int64_t kind) {
    static const char* names[] = {"?", "broadcast", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                  "barrier"};
    return kind >= 1 && kind <= Barrier ? names[kind] : names[0];
  }
  std::string text() const {
    std::ostringstream o;
    o << name(kind);
    if (kind == Barrier) return o.str();
    o << " of " << in << " " << (dtype >= 0 ? c10::toString(static_cast<c10::ScalarType>(dtype)) : "?")
      << " elements into " << out;
    if (op >= 0) o << ", reduce op " << op;
    if (root >= 0) o << ", root " << root;
    return o.str();
  }
};

// A collective's state, shared by the worker that runs it and the Work that waits for it.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

struct Job {
  Call call;
  std::function<HostWorks()> start;  // the Gloo collective(s) on host copies
  std::function<void()> finish;      // host work after them (the reduction of a reduce-scatter)
  std::shared_ptr<Completion> completion;
};

// A collective of the twin: complete when its worker has run it; wait() delivers its result to the
// device and makes the waiting thread's current stream depend on the collective's stream.
class TwinWork final : public c10d::Work {
 public:
  TwinWork(std::shared_ptr<Completion> completion, OrderClock* end, c10::DeviceIndex device, at::Tensor device_out,
           at::Tensor host_out)
      : completion_(std::move(completion)),
        end_(end),
        device_(device),
        device_out_(std::move(device_out)),
        host_out_(std::move(host_out)),
        out_data_(device_out_.defined() ? device_out_.storage().data() : nullptr) {}
  ~TwinWork() override { order_release(end_); }

  bool isCompleted() override {
    std::lock_guard<std::mutex> g(completion_->mu);
    return completion_->done;
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> g(completion_->mu);
    return completion_->done && !completion_->error;
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> g(completion_->mu);
    return completion_->error;
  }
  void synchronize() override { wait(::kNoTimeout); }

  bool wait(std::chrono::milliseconds timeout) override {
    {
      std::unique_lock<std::mutex> l(completion_->mu);
      auto done = [this] { return completion_->done; };
      if (timeout == ::kNoTimeout) {
        completion_->cv.wait(l, done);  // the Gloo collectives underneath carry the group's timeout
      } else if (!completion_->cv.wait_for(l, timeout, done)) {
        C10_THROW_ERROR(DistBackendError, "sim NCCL twin: the collective did not complete within " +
                                              std::to_string(timeout.count()) + " ms");
      }
    }
    // Failed or not, the collective's stream is done with the buffers: the waiter may free them.
    order_block(end_, get_current_stream(device_));
    if (exception()) std::rethrow_exception(exception());
    deliver();
    return true;
  }

 private:
  // The result into the device output, once: bytes the collective's stream wrote (recorded as its
  // use when it was issued). Skipped when the output's storage was freed or replaced meanwhile (a
  // hazard the stream-order check has reported): on a GPU those bytes would have gone to memory
  // that is no longer the output's.
  void deliver() {
    std::lock_guard<std::mutex> g(deliver_mu_);
    if (!host_out_.defined()) return;
    if (device_out_.numel() > 0 && device_out_.storage().data() == out_data_) {
      OrderQuiet quiet;
      DeviceAccess access;
      access.host_alias(device_out_).copy_(host_out_);
    }
    host_out_ = at::Tensor();
    device_out_ = at::Tensor();
  }

  std::shared_ptr<Completion> completion_;
  OrderClock* end_;  // the collective's stream after it
  c10::DeviceIndex device_;
  std::mutex deliver_mu_;
  at::Tensor device_out_, host_out_;
  const void* out_data_;
};

using Op = c10d::ReduceOp::RedOpType;

// output := op over the n equal slices of `received`, in rank order, accumulated in fp32 or wider
// (the sums of fsdpx's Gloo reduce-scatter, so sim gives the CPU's bits).
void reduce_in_rank_order(const at::Tensor& received, at::Tensor& output, Op op, int64_t n) {
  const at::Tensor rows = received.view({n, output.numel()});
  if (op == c10d::ReduceOp::MAX) {
    output.copy_(std::get<0>(rows.max(0)).view_as(output));
    return;
  }
  const auto wide = rows.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor acc = rows[0].to(wide, /*non_blocking=*/false, /*copy=*/true);
  for (int64_t r = 1; r < n; ++r) acc.add_(rows[r]);
  if (op == c10d::ReduceOp::AVG) acc.div_(n);
  output.copy_(acc.view_as(output));
}

class NcclTwin final : public c10d::Backend {
 public:
  NcclTwin(c10::intrusive_ptr<c10d::Backend> host, c10::DeviceIndex device)
      : Backend(host->getRank(), host->getSize()),
        host_(std::move(host)),
        device_(device),
        stream_(get_new_stream(device)),
        worker_([this] { run(); }) {}

  ~NcclTwin() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  const std::string getBackendName() const override { return kNcclTwinName; }

  WorkPtr broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    const at::Tensor t = one("broadcast", tensors);
    Call call{Call::Broadcast, dtype(t), t.numel(), t.numel(), -1, opts.rootRank};
    at::Tensor host = stage(t);
    auto h = host_;
    const int64_t root = opts.rootRank;
    return submit(call, t, host, [h, host, root] {
      std::vector<at::Tensor> ts{host};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      return HostWorks{h->broadcast(ts, o)};
    });
  }

  WorkPtr allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    const at::Tensor t = one("all_reduce", tensors);
    const Op op = supported("all_reduce", opts.reduceOp);
    Call call{Call::AllReduce, dtype(t), t.numel(), t.numel(), static_cast<int64_t>(op), -1};
    at::Tensor host = stage(t);
    auto h = host_;
    const int64_t n = getSize();
    return submit(
        call, t, host,
        [h, host, op] {
          std::vector<at::Tensor> ts{host};
          c10d::AllreduceOptions o;
          o.reduceOp = c10d::ReduceOp(op == c10d::ReduceOp::MAX ? op : c10d::ReduceOp::SUM);
          return HostWorks{h->allreduce(ts, o)};
        },
        [host, op, n]() mutable {
          if (op == c10d::ReduceOp::AVG) host.div_(n);
        });
  }

  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) override {
    check("all_gather", "input", input);
    check("all_gather", "output", output);
    pair("all_gather", output, input, output.numel() == input.numel() * getSize(),
         "the output must have the group size times the input's elements");
    Call call{Call::AllGather, dtype(input), input.numel(), output.numel(), -1, -1};
    at::Tensor in = stage(input);
    at::Tensor out = at::empty(output.sizes(), output.options().device(c10::kCPU));
    auto h = host_;
    return submit(call, output, out, [h, in, out]() mutable { return HostWorks{h->_allgather_base(out, in)}; });
  }

  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    check("reduce_scatter", "input", input);
    check("reduce_scatter", "output", output);
    pair("reduce_scatter", output, input, input.numel() == output.numel() * getSize(),
         "the input must have the group size times the output's elements");
    const Op op = supported("reduce_scatter", opts.reduceOp);
    Call call{Call::ReduceScatter, dtype(input), input.numel(), output.numel(), static_cast<int64_t>(op), -1};
    at::Tensor in = stage(input);
    at::Tensor received = at::empty_like(in), out = at::empty(output.sizes(), output.options().device(c10::kCPU));
    auto h = host_;
    const int64_t n = getSize();
    return submit(
        call, output, out,
        [h, in, received]() mutable {
          std::vector<int64_t> even;
          return HostWorks{h->alltoall_base(received, in, even, even, c10d::AllToAllOptions())};
        },
        [received, out, op, n]() mutable { reduce_in_rank_order(received, out, op, n); });
  }

  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                        std::vector<int64_t>& input_splits, const c10d::AllToAllOptions&) override {
    check("all_to_all", "input", input);
    check("all_to_all", "output", output);
    TORCH_CHECK_VALUE(output_splits.empty() && input_splits.empty(),
                      "sim NCCL twin: all_to_all with uneven splits is not implemented; use even splits");
    pair("all_to_all", output, input, output.numel() == input.numel() && input.numel() % getSize() == 0,
         "the output and the input must have the same elements, a multiple of the group size");
    Call call{Call::AllToAll, dtype(input), input.numel(), output.numel(), -1, -1};
    at::Tensor in = stage(input);
    at::Tensor out = at::empty(output.sizes(), output.options().device(c10::kCPU));
    auto h = host_;
    return submit(call, output, out, [h, in, out]() mutable {
      std::vector<int64_t> even;
      return HostWorks{h->alltoall_base(out, in, even, even, c10d::AllToAllOptions())};
    });
  }

  WorkPtr barrier(const c10d::BarrierOptions&) override {
    auto h = host_;
    return submit(Call{Call::Barrier}, at::Tensor(), at::Tensor(), [h] { return HostWorks{h->barrier()}; });
  }

 private:
  static int64_t dtype(const at::Tensor& t) { return static_cast<int64_t>(t.scalar_type()); }

  [[noreturn]] void refuse(const std::string& what, const std::string& why) const {
    C10_THROW_ERROR(ValueError, "sim NCCL twin (rank " + std::to_string(getRank()) + " of " +
                                    std::to_string(getSize()) + ", device sim:" + std::to_string(device_) + "): " +
                                    what + ": " + why);
  }

  // NCCL's tensor rules: a dense, contiguous tensor of this communicator's device.
  void check(const char* what, const char* role, const at::Tensor& t) const {
    const std::string where = std::string("the ") + role;
    if (!t.defined()) refuse(what, where + " is undefined");
    if (t.device().type() != c10::DeviceType::PrivateUse1)
      refuse(what, where + " is a " + t.device().str() + " tensor; NCCL takes tensors on its communicator's device "
                   "only (ProcessGroupNCCL: \"Tensors must be CUDA and dense\"): copy it to sim:" +
                   std::to_string(device_) + " first");
    if (t.device().index() != device_)
      refuse(what, where + " is on " + t.device().str() + ", but this communicator's device is sim:" +
                   std::to_string(device_) + " (ProcessGroupNCCL: \"Tensors must be on the same device\")");
    if (t.layout() != c10::kStrided) refuse(what, where + " is not dense (\"Tensors must be CUDA and dense\")");
    if (!t.is_contiguous()) refuse(what, where + " is not contiguous (\"Tensors must be contiguous\")");
  }

  void pair(const char* what, const at::Tensor& out, const at::Tensor& in, bool sizes_ok, const char* rule) const {
    if (out.scalar_type() != in.scalar_type())
      refuse(what, std::string("the output is ") + c10::toString(out.scalar_type()) + " but the input is " +
                       c10::toString(in.scalar_type()) + " (\"output tensor must have the same type as input\")");
    if (!sizes_ok)
      refuse(what, std::string(rule) + " (output " + std::to_string(out.numel()) + ", input " +
                       std::to_string(in.numel()) + ", group size " + std::to_string(getSize()) + ")");
  }

  at::Tensor one(const char* what, const std::vector<at::Tensor>& tensors) const {
    if (tensors.size() != 1)
      refuse(what, "expects one tensor per call, got " + std::to_string(tensors.size()));
    check(what, "tensor", tensors[0]);
    return tensors[0];
  }

  Op supported(const char* what, const c10d::ReduceOp& reduce) const {
    const Op op = reduce.op_;
    if (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG || op == c10d::ReduceOp::MAX) return op;
    refuse(what, "reduce op " + std::to_string(static_cast<int>(op)) + " is not implemented (sum, avg, max are)");
  }

  // The collective's stream first waits for the caller's current stream (ProcessGroupNCCL's
  // syncStream); then `t` is read there into a host copy: its use by the collective. As
  // ProcessGroupNCCL records its inputs on its stream (recordStream), freeing an input before the
  // wait is safe; an output is only kept alive (by the Work), so freeing its bytes is not.
  at::Tensor stage(const at::Tensor& t) {
    follow_current_stream();
    c10::StreamGuard on(stream_);
    at::Tensor host = at::empty(t.sizes(), t.options().device(c10::kCPU));
    if (t.numel() > 0) {
      DeviceAccess access;
      host.copy_(access.host_alias(t));
      order_stream_recorded(t.storage().data(), stream_);
    }
    return host;
  }

  void follow_current_stream() {
    OrderClock* caller = order_record(get_current_stream(device_), nullptr);
    order_block(caller, stream_);
    order_release(caller);
  }

  // Queues the collective for the worker. `device_out` is written on the collective's stream (its
  // use recorded now) and receives `host_out` when the collective is waited for.
  WorkPtr submit(const Call& call, const at::Tensor& device_out, const at::Tensor& host_out,
                 std::function<HostWorks()> start, std::function<void()> finish = nullptr) {
    follow_current_stream();
    if (device_out.defined() && device_out.numel() > 0) {
      c10::StreamGuard on(stream_);
      DeviceAccess access;
      access.host(device_out.storage().data());
    }
    OrderClock* end = order_record(stream_, nullptr);
    auto completion = std::make_shared<Completion>();
    {
      std::lock_guard<std::mutex> g(mu_);
      queue_.push_back(Job{call, std::move(start), std::move(finish), completion});
    }
    cv_.notify_all();
    return c10::make_intrusive<TwinWork>(completion, end, device_, device_out, host_out);
  }

  // The worker: each queued collective in issue order, after the group agreed on it.
  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stopping_ || !queue_.empty(); });
        if (stopping_) {  // as a destroyed NCCL communicator: what was never started fails
          for (Job& left : queue_) fail(left, "the communicator was destroyed before the collective started");
          return;
        }
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        agree(job.call);
        for (const auto& w : job.start()) w->wait();
        if (job.finish) job.finish();
      } catch (...) {
        error = std::current_exception();
      }
      complete(job, error);
    }
  }

  static void complete(Job& job, std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> g(job.completion->mu);
      job.completion->done = true;
      job.completion->error = std::move(error);
    }
    job.completion->cv.notify_all();
  }

  static void fail(Job& job, const std::string& why) {
    try {
      C10_THROW_ERROR(DistBackendError, "sim NCCL twin: " + job.call.text() + ": " + why);
    } catch (...) {
      complete(job, std::current_exception());
    }
  }

  // Every rank's call, through one small all-gather; a difference throws c10::DistBackendError
  // naming each rank's call.
  void agree(const Call& call) {
    const int64_t mine[Call::kFields] = {call.kind, call.dtype, call.in, call.out, call.op, call.root};
    at::Tensor in = at::empty({Call::kFields}, at::kLong);
    std::copy(mine, mine + Call::kFields, in.data_ptr<int64_t>());
    at::Tensor all = at::empty({Call::kFields * getSize()}, at::kLong);
    host_->_allgather_base(all, in)->wait();
    const int64_t* p = all.data_ptr<int64_t>();
    bool same = true;
    for (int64_t i = 0; i < all.numel(); ++i) same = same && p[i] == mine[i % Call::kFields];
    if (same) return;
    std::string calls;
    for (int r = 0; r < getSize(); ++r) {
      const int64_t* f = p + r * Call::kFields;
      calls += (r ? "; rank " : "rank ") + std::to_string(r) + ": " + Call{f[0], f[1], f[2], f[3], f[4], f[5]}.text();
    }
    C10_THROW_ERROR(DistBackendError, "sim NCCL twin: the ranks of this group called different collectives (" +
                                          calls + "); NCCL would hang or corrupt memory here");
  }

  c10::intrusive_ptr<c10d::Backend> host_;
  c10::DeviceIndex device_;
  c10::Stream stream_;  // the collectives' stream, as ProcessGroupNCCL has one per device
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::thread worker_;  // last: it starts once everything above is built
};

// The host as NCCL knows it: NCCL_HOSTID when set, else the host name and boot id, hashed as NCCL
// hashes it (DJB2a), so that every process of a host computes the same number.
int64_t host_hash() {
  std::string id;
  if (const char* set = std::getenv("NCCL_HOSTID"); set && *set) {
    id = set;
  } else {
    char name[256] = {0};
    ::gethostname(name, sizeof name - 1);
    std::string boot;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
    id = name + boot;
  }
  uint64_t h = 5381;
  for (unsigned char c : id) h = ((h << 5) + h) ^ c;
  return static_cast<int64_t>(h);
}

// NCCL's rule when a communicator is made: no two of its ranks on one device of one host ("Duplicate
// GPU detected"). The ranks exchange (host, device) over the host backend and all refuse alike.
void refuse_shared_devices(c10d::Backend& host, c10::DeviceIndex device) {
  const int n = host.getSize();
  at::Tensor mine = at::empty({2}, at::kLong), all = at::empty({2 * n}, at::kLong);
  mine.data_ptr<int64_t>()[0] = host_hash();
  mine.data_ptr<int64_t>()[1] = device;
  host._allgather_base(all, mine)->wait();
  const int64_t* p = all.data_ptr<int64_t>();
  for (int b = 1; b < n; ++b)
    for (int a = 0; a < b; ++a)
      if (p[2 * a] == p[2 * b] && p[2 * a + 1] == p[2 * b + 1])
        C10_THROW_ERROR(DistBackendError,
                        "sim NCCL twin: Duplicate GPU detected: rank " + std::to_string(b) + " and rank " +
                            std::to_string(a) + " both on sim:" + std::to_string(p[2 * b + 1]) +
                            " of one host; NCCL takes one rank of a communicator per device of a host: give each "
                            "rank a device of its own, or a host id of its own (NCCL_HOSTID, as --share-gpus does)");
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_nccl_twin(c10::intrusive_ptr<c10d::Backend> host, c10::DeviceIndex device) {
  TORCH_CHECK_VALUE(host, "sim NCCL twin: no host backend");
  TORCH_CHECK_VALUE(device >= 0 && device < device_count(), "sim NCCL twin: sim:", static_cast<int>(device),
                    " does not exist (", static_cast<int>(device_count()), " sim devices)");
  refuse_shared_devices(*host, device);
  return c10::make_intrusive<NcclTwin>(std::move(host), device);
}

}  // namespace fsdpx::sim

extern "C" void* fsdpx_sim_make_nccl_twin(void* host, int device) {
  auto h = c10::intrusive_ptr<c10d::Backend>::reclaim(static_cast<c10d::Backend*>(host));
  return fsdpx::sim::make_nccl_twin(std::move(h), static_cast<c10::DeviceIndex>(device)).release();
}
