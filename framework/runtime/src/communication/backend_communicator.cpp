#include "backend_communicator.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>

#include <ATen/ops/empty.h>
#include <ATen/ops/maximum.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "failure_flag.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "message_text.h"

namespace fsdpx {
namespace {

// `native_average`: the backend averages itself (NCCL's ncclAvg); else a sum divided afterwards.
c10d::ReduceOp to_c10d(ReduceOp op, bool native_average) {
  if (op == ReduceOp::Max) return c10d::ReduceOp(c10d::ReduceOp::MAX);
  if (op == ReduceOp::Avg && native_average) return c10d::ReduceOp(c10d::ReduceOp::AVG);
  return c10d::ReduceOp(c10d::ReduceOp::SUM);
}

// output := op over the n slices of the reduce-scatter in rank order: this rank's own (`me`) from
// `input`, the others from `received` (rank order; with a slot of its own at `me` when `own_slot`),
// summed in fp32 or wider: straight into `output` when it has the accumulation dtype (the same
// additions in the same order, so the same bits, without a temporary of its size).
void reduce_slices(const at::Tensor& input, const at::Tensor& received, bool own_slot, int64_t me, at::Tensor& output,
                   ReduceOp op, int64_t n) {
  at::NoGradGuard no_grad;
  const int64_t m = output.numel();
  at::Tensor others = received.view({own_slot ? n : n - 1, m});
  auto slice = [&](int64_t j) {
    return j == me ? input.view({n, m})[me] : others[own_slot || j < me ? j : j - 1];
  };
  const auto acc_type = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // Not in place where the output is part of the input (the own slice, NCCL's in-place form): it
  // is read until the last addition.
  const bool in_place = output.scalar_type() == acc_type && op != ReduceOp::Max && !output.is_alias_of(input);
  at::Tensor sum = in_place ? output.view({-1})
                  : at::empty({m}, op == ReduceOp::Max ? input.options() : output.options().dtype(acc_type));
  sum.copy_(slice(0));
  for (int64_t r = 1; r < n; ++r) {
    if (op == ReduceOp::Max)
      at::maximum_out(sum, sum, slice(r));
    else
      sum.add_(slice(r));
  }
  if (op == ReduceOp::Avg) sum.div_(n);
  if (!in_place) output.copy_(sum.view_as(output));
}

}  // namespace

BackendCommunicator::BackendCommunicator(std::string name, c10::intrusive_ptr<c10d::Backend> backend,
                                         std::vector<int> global_ranks, int global_rank,
                                         std::shared_ptr<const PeerMonitor> monitor, std::chrono::milliseconds timeout,
                                         std::shared_ptr<FlightRecorder> recorder, bool check_collectives,
                                         c10::Device device)
    : name_(std::move(name)),
      backend_(std::move(backend)),
      global_ranks_(std::move(global_ranks)),
      global_rank_(global_rank),
      monitor_(std::move(monitor)),
      timeout_(timeout),
      recorder_(std::move(recorder)),
      check_collectives_(check_collectives),
      device_(device),
      gloo_(backend_->getBackendName() == "gloo") {}

Work BackendCommunicator::all_gather(at::Tensor output, at::Tensor input) {
  check_pair("all_gather", output, input, output.numel() == input.numel() * size(),
             "output must have size() x input's elements");
  const uint64_t id = begin("all_gather", input.scalar_type(), input.numel(), input.device());
  if (gloo_) return all_gather_by_broadcasts(id, output, input);
  return issue("all_gather", id, [&] { return C10dWorks{backend_->_allgather_base(output, input)}; });
}

Work BackendCommunicator::all_gather_by_broadcasts(uint64_t id, at::Tensor output, at::Tensor input) {
  const int64_t n = input.numel();
  at::Tensor slots = output.view({size(), n});
  {
    at::NoGradGuard no_grad;
    slots[rank()].copy_(input.view({n}));
  }
  c10d::BroadcastOptions opts;
  opts.timeout = timeout_;
  return issue("all_gather", id, [&] {
    C10dWorks works;
    for (int r = 0; r < size(); ++r) {
      std::vector<at::Tensor> slot{slots[r]};
      opts.rootRank = r;
      works.push_back(backend_->broadcast(slot, opts));
    }
    return works;
  });
}

Work BackendCommunicator::reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) {
  check_pair("reduce_scatter", output, input, input.numel() == output.numel() * size(),
             "input must have size() x output's elements");
  check_average("reduce_scatter", output, op);
  const uint64_t id = begin("reduce_scatter", output.scalar_type(), output.numel(), output.device());
  if (gloo_) return reduce_scatter_by_all_to_all(id, output, input, op);
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = to_c10d(op, !gloo_);
  opts.timeout = timeout_;
  return issue("reduce_scatter", id, [&] { return C10dWorks{backend_->_reduce_scatter_base(output, input, opts)}; },
               average(op, output));
}

Work BackendCommunicator::reduce_scatter_by_all_to_all(uint64_t id, at::Tensor output, at::Tensor input, ReduceOp op) {
  // The first and the last rank send nothing to themselves (their own slice, at one end of the
  // input, is read from it), so their receive buffer is (n - 1) / n of the input: at two ranks,
  // every rank's is half. Gloo's all-to-all takes one contiguous input, so a rank in between
  // exchanges the whole.
  const int64_t n = size(), me = rank(), m = output.numel();
  const bool own_slot = me != 0 && me != n - 1;
  at::Tensor flat = input.view({-1});
  at::Tensor send = own_slot ? flat : flat.narrow(0, me == 0 ? m : 0, (n - 1) * m);
  at::Tensor received = at::empty({own_slot ? n * m : (n - 1) * m}, input.options());
  // Split sizes on every rank, so that every rank runs Gloo's alltoallv (not its even alltoall);
  // two vectors, as ProcessGroupGloo moves from each.
  std::vector<int64_t> in_splits(static_cast<size_t>(n), m);
  if (!own_slot) in_splits[static_cast<size_t>(me)] = 0;
  std::vector<int64_t> out_splits = in_splits;
  c10d::AllToAllOptions opts;
  opts.timeout = timeout_;
  return issue(
      "reduce_scatter", id,
      [&] {  // one rank: nothing to exchange, its slice is the result
        return n == 1 ? C10dWorks{} : C10dWorks{backend_->alltoall_base(received, send, out_splits, in_splits, opts)};
      },
      [flat, received, own_slot, me, output, op, n]() mutable {
        reduce_slices(flat, received, own_slot, me, output, op, n);
        free_now(received);  // now: Gloo's bookkeeping of the finished work may hold it a while
      });
}

Work BackendCommunicator::all_to_all(at::Tensor output, at::Tensor input) {
  check_pair("all_to_all", output, input, output.numel() == input.numel() && input.numel() % size() == 0,
             "output and input must have the same elements, a multiple of size()");
  const uint64_t id = begin("all_to_all", input.scalar_type(), input.numel(), input.device());
  std::vector<int64_t> even;
  c10d::AllToAllOptions opts;
  opts.timeout = timeout_;
  return issue("all_to_all", id, [&] { return C10dWorks{backend_->alltoall_base(output, input, even, even, opts)}; });
}

Work BackendCommunicator::all_reduce(at::Tensor tensor, ReduceOp op) {
  check_one("all_reduce", tensor);
  check_average("all_reduce", tensor, op);
  std::vector<at::Tensor> ts{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op, !gloo_);
  opts.timeout = timeout_;
  const uint64_t id = begin("all_reduce", tensor.scalar_type(), tensor.numel(), tensor.device());
  return issue("all_reduce", id, [&] { return C10dWorks{backend_->allreduce(ts, opts)}; }, average(op, tensor));
}

Work BackendCommunicator::broadcast(at::Tensor tensor, int root) {
  check_one("broadcast", tensor);
  if (root < 0 || root >= size())
    throw Error("broadcast on group '" + name_ + "': root " + std::to_string(root) +
                " is not a rank of this group of " + std::to_string(size()));
  std::vector<at::Tensor> ts{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = timeout_;
  const uint64_t id = begin("broadcast", tensor.scalar_type(), tensor.numel(), tensor.device());
  return issue("broadcast", id, [&] { return C10dWorks{backend_->broadcast(ts, opts)}; });
}

Work BackendCommunicator::barrier() {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  // NCCL's check would need a device buffer; a barrier carries no data to disagree on anyway.
  const uint64_t id = begin("barrier", at::kByte, 0, device_);
  return issue("barrier", id, [&] { return C10dWorks{backend_->barrier(opts)}; });
}

std::function<void()> BackendCommunicator::average(ReduceOp op, at::Tensor t) const {
  if (op != ReduceOp::Avg || !gloo_) return nullptr;  // NCCL averages itself
  const int n = size();
  return [t, n]() mutable { t.div_(n); };
}

void BackendCommunicator::check_one(const char* what, const at::Tensor& t) const {
  if (!t.defined() || !t.is_contiguous())
    throw Error(std::string(what) + " on group '" + name_ + "': the tensor must be defined and contiguous");
}

void BackendCommunicator::check_average(const char* what, const at::Tensor& t, ReduceOp op) const {
  if (op == ReduceOp::Avg && !at::isFloatingType(t.scalar_type()))
    throw Error(std::string(what) + " on group '" + name_ + "': an average of " + c10::toString(t.scalar_type()) +
                " values is not representable; use Sum");
}

void BackendCommunicator::check_pair(const char* what, const at::Tensor& out, const at::Tensor& in, bool sizes_ok,
                                     const char* rule) const {
  check_one(what, out);
  check_one(what, in);
  if (out.scalar_type() != in.scalar_type())
    throw Error(std::string(what) + " on group '" + name_ + "': output is " + c10::toString(out.scalar_type()) +
                " but input is " + c10::toString(in.scalar_type()));
  if (!sizes_ok)
    throw Error(std::string(what) + " on group '" + name_ + "': " + rule + " (output " + std::to_string(out.numel()) +
                ", input " + std::to_string(in.numel()) + ", group size " + std::to_string(size()) + ")");
}

uint64_t BackendCommunicator::begin(const char* what, c10::ScalarType dtype, int64_t count, c10::Device device) {
  const int64_t seq = ++seq_;
  const FlightEntry call = recorder_->record(name_, seq, what, dtype, count);
  if (check_collectives_ && (gloo_ || !device.is_cpu())) {
    try {
      check_across_ranks(call, device);
    } catch (...) {
      recorder_->finish(call.id, false);
      throw;
    }
  }
  return call.id;
}

namespace {
constexpr int64_t kCallBytes = 256;  // one serialised record, truncated: what check_collectives exchanges
}  // namespace

void BackendCommunicator::check_across_ranks(const FlightEntry& call, c10::Device device) {
  std::string mine = serialize_entry(call);
  mine.resize(kCallBytes, '\0');
  at::Tensor in = at::empty({kCallBytes}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(in.data_ptr(), mine.data(), kCallBytes);
  in = in.to(device);
  at::Tensor out = at::empty({kCallBytes * size()}, in.options());
  try {
    backend_->_allgather_base(out, in)->wait(timeout_);
  } catch (const std::exception& e) {
    throw failure("check_collectives all_gather", e, /*diagnose=*/true);
  }
  out = out.cpu();
  std::map<int, FlightEntry> calls;
  for (int r = 0; r < size(); ++r) {
    const char* p = static_cast<const char*>(out.data_ptr()) + r * kCallBytes;
    auto parsed = parse_flight(std::string(p, strnlen(p, kCallBytes)));
    calls[global_ranks_[static_cast<size_t>(r)]] = parsed.empty() ? FlightEntry{} : parsed.front();
  }
  const std::string differs = disagreement(calls);
  if (!differs.empty())
    throw Error("rank " + std::to_string(global_rank_) + ": --check-collectives: the ranks of group '" + name_ +
                "' (ranks " + join_ints(global_ranks_) + ") are about to call different collectives: " + differs);
}

Work BackendCommunicator::issue(const char* what, uint64_t id, const std::function<C10dWorks()>& start,
                                std::function<void()> finish) {
  C10dWorks works;
  try {
    works = start();
  } catch (const std::exception& e) {
    recorder_->finish(id, false);
    throw failure(what, e, /*diagnose=*/false);  // refused at once: a local problem
  }
  auto self = shared_from_this();
  return Work([self, works, finish, what, id] {
    try {
      // Gloo: the host waits, up to the collective timeout. NCCL: wait() without a timeout makes
      // the current stream wait for the collective and returns at once; the host never blocks
      // (a lost peer is caught by the peer monitor's watch and NCCL's own timeout). sim's twin
      // does the same to its streams, its host waiting for the bytes, up to its Gloo's timeout.
      for (const auto& work : works) {
        if (self->gloo_) work->wait(self->timeout_);
        else work->wait();
      }
    } catch (const std::exception& e) {
      self->recorder_->finish(id, false);
      throw self->failure(what, e, /*diagnose=*/true);
    }
    if (finish) finish();
    self->recorder_->finish(id, true);
  });
}

Error BackendCommunicator::failure(const char* what, const std::exception& e, bool diagnose) const {
  std::string msg = "rank " + std::to_string(global_rank_) + ": " + what + " on group '" + name_ + "' (ranks " +
                    join_ints(global_ranks_) + ") failed: " + first_line(e);
  if (diagnose && monitor_) {
    failure_seen().store(true);
    std::string text = first_line(e);
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
    const bool timed_out = text.find("timed out") != std::string::npos || text.find("timeout") != std::string::npos;
    msg += "; " + monitor_->diagnose(global_ranks_, name_, timed_out);
  }
  return Error(msg);
}

}  // namespace fsdpx
