#include "fsdpx/framework/process_groups.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <sstream>
#include <thread>

#include <c10/util/Logging.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/c10d_backends.h"

namespace fsdpx {
namespace {

using Clock = std::chrono::steady_clock;

std::string first_line(const std::exception& e) {
  std::string what;
  if (auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    what = c10->what_without_backtrace();
  } else {
    what = e.what();
  }
  auto nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream s;
  s << static_cast<double>(ms.count()) / 1000.0 << " s";
  return s.str();
}

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return out;
}

// Set once a collective failed on this rank: the process groups then linger a little before
// tearing down, so that peers still diagnosing can read this rank's heartbeat (and, on rank 0,
// reach the store it serves).
std::atomic<bool>& failure_seen() {
  static std::atomic<bool> seen{false};
  return seen;
}

// Every rank bumps a counter in the store twice a second. After a failed collective, a rank
// whose counter has stopped is reported as lost. Uses its own store connection.
class PeerMonitor {
 public:
  PeerMonitor(const Topology& t, std::chrono::milliseconds timeout) : rank_(t.rank) {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(t.master_port);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = timeout;
    store_ = c10::make_intrusive<c10d::TCPStore>(t.master_addr, o);
    thread_ = std::thread([this] { run(); });
  }
  ~PeerMonitor() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Which of `ranks` stopped beating. Takes about two seconds.
  std::string diagnose(const std::vector<int>& ranks) const {
    try {
      std::vector<int64_t> before;
      for (int r : ranks) before.push_back(store_->add(key(r), 0));
      std::this_thread::sleep_for(std::chrono::milliseconds(2000));
      std::vector<int> lost;
      for (size_t i = 0; i < ranks.size(); ++i) {
        if (ranks[i] != rank_ && store_->add(key(ranks[i]), 0) == before[i]) lost.push_back(ranks[i]);
      }
      if (lost.empty()) return "every peer is still alive, so it was a timeout or a network fault";
      return std::string(lost.size() == 1 ? "rank " : "ranks ") + join_ints(lost) +
             (lost.size() == 1 ? " is" : " are") + " gone (no heartbeat for 2 s)";
    } catch (const std::exception&) {
      return "rank 0, which hosts the rendezvous store, is gone";
    }
  }

 private:
  static std::string key(int r) { return "fsdpx/heartbeat/" + std::to_string(r); }
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      lock.unlock();
      try {
        store_->add(key(rank_), 1);
      } catch (const std::exception&) {
        // The store may be gone (diagnose() will say so) or briefly unreachable: keep trying.
      }
      lock.lock();
      cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; });
    }
  }
  int rank_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
};

class BackendCommunicator final : public Communicator,
                                  public std::enable_shared_from_this<BackendCommunicator> {
 public:
  BackendCommunicator(std::string name, c10::intrusive_ptr<c10d::Backend> backend,
                      std::vector<int> global_ranks, int global_rank,
                      std::shared_ptr<const PeerMonitor> monitor, std::chrono::milliseconds timeout)
      : name_(std::move(name)),
        backend_(std::move(backend)),
        global_ranks_(std::move(global_ranks)),
        global_rank_(global_rank),
        monitor_(std::move(monitor)),
        timeout_(timeout),
        gloo_(backend_->getBackendName() == "gloo") {}

  int rank() const override { return backend_->getRank(); }
  int size() const override { return backend_->getSize(); }
  const std::string& name() const override { return name_; }

  Work all_gather(at::Tensor output, at::Tensor input) override {
    check_pair("all_gather", output, input, output.numel() == input.numel() * size(),
               "output must have size() x input's elements");
    return issue("all_gather", [&] { return backend_->_allgather_base(output, input); });
  }

  Work reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) override {
    check_pair("reduce_scatter", output, input, input.numel() == output.numel() * size(),
               "input must have size() x output's elements");
    check_average("reduce_scatter", output, op);
    if (gloo_) {
      // LibTorch's Gloo reduce-scatter is an all-reduce underneath: each rank sends 2(n-1)/n of
      // the buffer instead of (n-1)/n (measured on the sockets, see fsdpx-comm-bench). An
      // all-to-all moves exactly the (n-1)/n: rank r receives everyone's slice r and sums the
      // slices locally, in rank order (so every rank adds in the same order).
      at::Tensor received = at::empty_like(input);
      std::vector<int64_t> even;
      c10d::AllToAllOptions opts;
      opts.timeout = timeout_;
      const int64_t n = size();
      return issue("reduce_scatter", [&] { return backend_->alltoall_base(received, input, even, even, opts); },
                   [received, output, op, n]() mutable {
                     at::NoGradGuard no_grad;
                     at::Tensor slices = received.view({n, output.numel()});
                     if (op == ReduceOp::Max) {
                       output.copy_(std::get<0>(slices.max(0)));
                     } else {
                       // Accumulate in fp32 (or wider), slice by slice in rank order, then round once.
                       const auto acc_type = slices.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
                       at::Tensor sum = slices[0].to(acc_type, /*non_blocking=*/false, /*copy=*/true);
                       for (int64_t r = 1; r < n; ++r) sum.add_(slices[r]);
                       if (op == ReduceOp::Avg) sum.div_(n);
                       output.copy_(sum.view_as(output));
                     }
                   });
    }
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = timeout_;
    return issue("reduce_scatter", [&] { return backend_->_reduce_scatter_base(output, input, opts); },
                 average(op, output));
  }

  Work all_reduce(at::Tensor tensor, ReduceOp op) override {
    check_one("all_reduce", tensor);
    check_average("all_reduce", tensor, op);
    std::vector<at::Tensor> ts{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = timeout_;
    return issue("all_reduce", [&] { return backend_->allreduce(ts, opts); }, average(op, tensor));
  }

  Work broadcast(at::Tensor tensor, int root) override {
    check_one("broadcast", tensor);
    if (root < 0 || root >= size())
      throw Error("broadcast on group '" + name_ + "': root " + std::to_string(root) +
                  " is not a rank of this group of " + std::to_string(size()));
    std::vector<at::Tensor> ts{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = timeout_;
    return issue("broadcast", [&] { return backend_->broadcast(ts, opts); });
  }

  Work barrier() override {
    c10d::BarrierOptions opts;
    opts.timeout = timeout_;
    return issue("barrier", [&] { return backend_->barrier(opts); });
  }

 private:
  // Gloo's AVG is unreliable in some versions: sum, then divide.
  static c10d::ReduceOp to_c10d(ReduceOp op) {
    return op == ReduceOp::Max ? c10d::ReduceOp(c10d::ReduceOp::MAX) : c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
  std::function<void()> average(ReduceOp op, at::Tensor t) const {
    if (op != ReduceOp::Avg) return nullptr;
    const int n = size();
    return [t, n]() mutable { t.div_(n); };
  }

  void check_one(const char* what, const at::Tensor& t) const {
    if (!t.defined() || !t.is_contiguous())
      throw Error(std::string(what) + " on group '" + name_ + "': the tensor must be defined and contiguous");
  }
  void check_average(const char* what, const at::Tensor& t, ReduceOp op) const {
    if (op == ReduceOp::Avg && !at::isFloatingType(t.scalar_type()))
      throw Error(std::string(what) + " on group '" + name_ + "': an average of " +
                  c10::toString(t.scalar_type()) + " values is not representable; use Sum");
  }
  void check_pair(const char* what, const at::Tensor& out, const at::Tensor& in, bool sizes_ok,
                  const char* rule) const {
    check_one(what, out);
    check_one(what, in);
    if (out.scalar_type() != in.scalar_type())
      throw Error(std::string(what) + " on group '" + name_ + "': output is " +
                  c10::toString(out.scalar_type()) + " but input is " + c10::toString(in.scalar_type()));
    if (!sizes_ok)
      throw Error(std::string(what) + " on group '" + name_ + "': " + rule + " (output " +
                  std::to_string(out.numel()) + ", input " + std::to_string(in.numel()) +
                  ", group size " + std::to_string(size()) + ")");
  }

  // The returned Work holds this communicator (and so its backend and monitor) alive.
  template <class Issue>
  Work issue(const char* what, Issue&& start, std::function<void()> finish = nullptr) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = start();
    } catch (const std::exception& e) {
      throw failure(what, e, /*diagnose=*/false);  // refused at once: a local problem
    }
    auto self = shared_from_this();
    return Work([self, work, finish, what] {
      try {
        work->wait(self->timeout_);
      } catch (const std::exception& e) {
        throw self->failure(what, e, /*diagnose=*/true);
      }
      if (finish) finish();
    });
  }

  Error failure(const char* what, const std::exception& e, bool diagnose) const {
    std::string msg = "rank " + std::to_string(global_rank_) + ": " + what + " on group '" + name_ +
                      "' (ranks " + join_ints(global_ranks_) + ") failed: " + first_line(e);
    if (diagnose && monitor_) {
      failure_seen().store(true);
      msg += "; " + monitor_->diagnose(global_ranks_);
    }
    return Error(msg);
  }

  std::string name_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::vector<int> global_ranks_;
  int global_rank_;
  std::shared_ptr<const PeerMonitor> monitor_;
  std::chrono::milliseconds timeout_;
  bool gloo_;
};

// c10d logs its own warnings and errors (socket timeouts, retries) to stderr before fsdpx turns
// the failure into one clear message. Keep them out unless the user asked for LibTorch's logs
// (TORCH_CPP_LOG_LEVEL) or fsdpx's debug output (FSDPX_LOG=debug).
void quiet_c10d_logging() {
  const char* torch_level = std::getenv("TORCH_CPP_LOG_LEVEL");
  const char* fsdpx_log = std::getenv("FSDPX_LOG");
  if (torch_level || (fsdpx_log && std::string(fsdpx_log) == "debug")) return;
  FLAGS_caffe2_log_level = std::max<int>(FLAGS_caffe2_log_level, 3);  // fatal only
}

}  // namespace

struct ProcessGroups::Impl {
  RuntimeOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<const PeerMonitor> monitor;
  std::shared_ptr<Communicator> world;
  std::map<std::string, int> groups_created;  // per (name, members): agreed by the members alone

  std::shared_ptr<Communicator> make(const std::string& name, const std::vector<int>& ranks) {
    const int me = options.topology.rank;
    auto it = std::find(ranks.begin(), ranks.end(), me);
    if (it == ranks.end())
      throw Error("rank " + std::to_string(me) + " asked to create group '" + name + "' (ranks " +
                  join_ints(ranks) + "), which does not include it");
    const int group_rank = static_cast<int>(it - ranks.begin());
    const int size = static_cast<int>(ranks.size());
    // A unique store namespace per group: its name, its members and its creation order.
    const std::string key = "fsdpx/group/" + name + "/" + join_ints(ranks);
    auto prefix = c10::make_intrusive<c10d::PrefixStore>(key + "/" + std::to_string(groups_created[key]++), store);
    c10::intrusive_ptr<c10d::Backend> backend;
    try {
      if (options.device == DeviceKind::Cuda) {
        backend = make_nccl_backend(prefix, group_rank, size, options.collective_timeout,
                                    options.topology.local_rank);
      } else {
        backend = make_gloo_backend(prefix, group_rank, size, options.collective_timeout);
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error("rank " + std::to_string(me) + ": creating group '" + name + "' (ranks " +
                  join_ints(ranks) + ") failed: " + first_line(e));
    }
    return std::make_shared<BackendCommunicator>(name, backend, ranks, me, monitor,
                                                 options.collective_timeout);
  }
};

std::shared_ptr<ProcessGroups> ProcessGroups::create(const RuntimeOptions& options) {
  quiet_c10d_logging();
  const Topology& t = options.topology;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const std::string master = t.master_addr + ":" + std::to_string(t.master_port);
  const auto timeout = options.rendezvous_timeout;
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(t.master_port);
    o.isServer = t.rank == 0;
    o.numWorkers = std::nullopt;
    o.waitWorkers = false;  // we wait ourselves, to name the ranks that are missing
    o.timeout = timeout;
    impl->store = c10::make_intrusive<c10d::TCPStore>(t.master_addr, o);
  } catch (const std::exception& e) {
    if (t.rank == 0)
      throw Error("rank 0 cannot serve the rendezvous on port " + std::to_string(t.master_port) +
                  " (MASTER_PORT / --master-port): " + first_line(e));
    throw Error("rank " + std::to_string(t.rank) + " cannot reach the rendezvous master at " + master +
                " (MASTER_ADDR/MASTER_PORT) within " + seconds(timeout) +
                ": is rank 0 running, and are the address and port right? (" + first_line(e) + ")");
  }

  // Join: every rank announces itself, then waits for all the others.
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::vector<std::string> keys;
  for (int r = 0; r < t.world_size; ++r) keys.push_back("fsdpx/join/" + std::to_string(r));
  try {
    impl->store->set(keys[t.rank], std::string(host) + ":" + std::to_string(::getpid()));
    impl->store->wait(keys, timeout);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (int r = 0; r < t.world_size; ++r)
        if (!impl->store->check({keys[r]})) missing.push_back(r);
    } catch (const std::exception&) {
      throw Error("rank " + std::to_string(t.rank) + ": lost the rendezvous store at " + master +
                  " while waiting for the other ranks: " + first_line(e));
    }
    throw Error("rendezvous at " + master + " timed out after " + seconds(timeout) + ": " +
                std::to_string(t.world_size - static_cast<int>(missing.size())) + " of " +
                std::to_string(t.world_size) + " ranks joined; missing: rank" +
                (missing.size() == 1 ? " " : "s ") + join_ints(missing) +
                " (raise --rendezvous-timeout if they are only slow to start)");
  }
  try {
    impl->monitor = std::make_shared<PeerMonitor>(t, timeout);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(t.rank) + ": cannot open the heartbeat connection to " +
                master + ": " + first_line(e));
  }
  std::vector<int> all(t.world_size);
  for (int r = 0; r < t.world_size; ++r) all[r] = r;
  impl->world = impl->make("world", all);
  return std::shared_ptr<ProcessGroups>(new ProcessGroups(std::move(impl)));
}

ProcessGroups::ProcessGroups(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroups::~ProcessGroups() {
  if (failure_seen().load()) {
    // Let peers finish diagnosing against this rank's heartbeat and, on rank 0, its store.
    std::this_thread::sleep_for(std::chrono::milliseconds(impl_->options.topology.rank == 0 ? 3000 : 1500));
  }
}

const Topology& ProcessGroups::topology() const { return impl_->options.topology; }
DeviceKind ProcessGroups::device() const { return impl_->options.device; }
std::shared_ptr<Communicator> ProcessGroups::world() const { return impl_->world; }

std::shared_ptr<Communicator> ProcessGroups::new_group(const std::string& name,
                                                       const std::vector<int>& ranks) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= impl_->options.topology.world_size || (i && ranks[i] <= ranks[i - 1]))
      throw Error("group '" + name + "': ranks (" + join_ints(ranks) +
                  ") must be ascending, distinct and below the world size " +
                  std::to_string(impl_->options.topology.world_size));
  }
  return impl_->make(name, ranks);
}

ProcessGroups::Hybrid ProcessGroups::hybrid(int shard_size) {
  const Topology& t = impl_->options.topology;
  if (shard_size < 1 || t.world_size % shard_size != 0)
    throw Error("hybrid sharding: shard size " + std::to_string(shard_size) +
                " must divide the world size " + std::to_string(t.world_size));
  const int shard_index = t.rank / shard_size, within = t.rank % shard_size;
  std::vector<int> shard, replicate;
  for (int i = 0; i < shard_size; ++i) shard.push_back(shard_index * shard_size + i);
  for (int g = 0; g < t.world_size / shard_size; ++g) replicate.push_back(g * shard_size + within);
  Hybrid h;
  h.shard = impl_->make("shard", shard);
  h.replicate = impl_->make("replicate", replicate);
  return h;
}

}  // namespace fsdpx
