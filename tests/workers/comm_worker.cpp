// A worker for the multi-process runtime tests. Topology from the environment (torchrun's or
// Slurm's variables, or the local launcher with --nproc-per-node); each --scenario checks one
// thing and exits 0, or prints what went wrong and exits non-zero.
//
//   collectives  every collective at fp32 and bf16, uneven values and sizes, against values
//                computed locally
//   hybrid       shard and replicate sub-groups (needs LOCAL_WORLD_SIZE to divide WORLD_SIZE)
//   die          one all-reduce, then rank 1 is killed; the others enter another all-reduce
//                and must fail naming rank 1
//   exit         rank --fail-rank exits with --code after a barrier; the others sleep
//   sleep        every rank writes its pid to --dir and sleeps (to be signalled)
//   mismatch     an all-reduce, then an all-gather of 1000 elements per rank, but 999 on
//                --fail-rank (run it with --check-collectives, which must refuse it)
//   lost         a barrier, then rank --fail-rank kills itself with SIGKILL while the others
//                compute (no collective): with --watch-peers they must end naming it
//   nccl-rules   (--device sim, the NCCL twin) breaks each of NCCL's rules on purpose and prints
//                "rule NAME fired: MESSAGE" for each that was refused, then checks the same
//                collectives pass when the rules are kept
// --device sim|cuda runs the collectives on that device's tensors (sim: on its NCCL twin, or with
// --backend gloo staged through host memory and Gloo), and checks that the control group is Gloo
// on the CPU.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <thread>

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/framework/runtime/topology_resolver.h"
#include "tool.h"

using namespace fsdpx;
namespace po = boost::program_options;

namespace {

c10::Device g_device(c10::kCPU);  // --device: where the collectives' tensors live

// `t` on the device of the run.
at::Tensor dev(const at::Tensor& t) { return t.to(g_device); }

// Values that stay exact in bf16 through sums of up to 4 ranks and a division by 2 or 4:
// multiples of 1/8 below 2, different on every rank and every element.
at::Tensor values(int rank, int64_t n, at::ScalarType dtype, int64_t offset = 0) {
  at::Tensor i = at::arange(offset, offset + n, at::kLong);
  return at::remainder(i * 3 + rank * 7, 16).to(at::kFloat).mul(0.125).to(dtype);
}

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (got.device() != g_device && got.device() != c10::Device(c10::kCPU))
    throw Error(what + ": the result is on " + got.device().str() + ", not " + g_device.str());
  if (!got.cpu().to(at::kFloat).equal(want.cpu().to(at::kFloat)))
    throw Error(what + ": got " + std::to_string(got.cpu().to(at::kFloat).sum().item<double>()) +
                " (sum), expected " + std::to_string(want.to(at::kFloat).sum().item<double>()));
}

void collectives(Communicator& c) {
  const int w = c.size(), r = c.rank();
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const std::string dt = dtype == at::kFloat ? "fp32" : "bf16";
    for (int64_t n : {1, 7, 1000, 4097}) {
      const std::string at_ = " (" + dt + ", n=" + std::to_string(n) + ", " + std::to_string(w) + " ranks)";
      // all_gather: every rank's slice, in rank order.
      at::Tensor out = dev(at::empty({w * n}, dtype));
      c.all_gather(out, dev(values(r, n, dtype))).wait();
      std::vector<at::Tensor> parts;
      for (int k = 0; k < w; ++k) parts.push_back(values(k, n, dtype));
      expect_equal(out, at::cat(parts), "all_gather" + at_);
      // reduce_scatter: this rank's slice of the elementwise sum (average, max); on the CPU also
      // in place, into the input's own slice (NCCL's in-place form).
      for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        std::vector<at::Tensor> all;
        for (int k = 0; k < w; ++k) all.push_back(values(k, n, at::kFloat, r * n));
        at::Tensor s = at::stack(all);
        at::Tensor want = op == ReduceOp::Max ? std::get<0>(s.max(0)) : s.sum(0);
        if (op == ReduceOp::Avg) want /= w;
        const std::string what =
            std::string("reduce_scatter ") + (op == ReduceOp::Sum ? "sum" : op == ReduceOp::Avg ? "avg" : "max");
        at::Tensor shard = dev(at::empty({n}, dtype));
        c.reduce_scatter(shard, dev(values(r, w * n, dtype)), op).wait();
        expect_equal(shard, want.to(dtype), what + at_);
        if (!g_device.is_cpu()) continue;
        at::Tensor input = values(r, w * n, dtype);
        at::Tensor own = input.narrow(0, r * n, n);
        c.reduce_scatter(own, input, op).wait();
        expect_equal(own, want.to(dtype), what + " in place" + at_);
      }
      // all_reduce: sum, average, max.
      for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        at::Tensor t = dev(values(r, n, dtype));
        c.all_reduce(t, op).wait();
        std::vector<at::Tensor> all;
        for (int k = 0; k < w; ++k) all.push_back(values(k, n, at::kFloat));
        at::Tensor s = at::stack(all);
        at::Tensor want = op == ReduceOp::Max ? std::get<0>(s.max(0)) : s.sum(0);
        if (op == ReduceOp::Avg) want /= w;
        expect_equal(t, want.to(dtype), std::string("all_reduce ") +
                     (op == ReduceOp::Sum ? "sum" : op == ReduceOp::Avg ? "avg" : "max") + at_);
      }
      // all_to_all: chunk k of rank k's input comes to every rank k, in rank order.
      at::Tensor mixed = dev(at::empty({w * n}, dtype));
      c.all_to_all(mixed, dev(values(r, w * n, dtype))).wait();
      std::vector<at::Tensor> chunks;
      for (int k = 0; k < w; ++k) chunks.push_back(values(k, n, dtype, r * n));
      expect_equal(mixed, at::cat(chunks), "all_to_all" + at_);
      // broadcast from the last rank.
      at::Tensor b = dev(values(r, n, dtype));
      c.broadcast(b, w - 1).wait();
      expect_equal(b, values(w - 1, n, dtype), "broadcast" + at_);
    }
  }
  c.barrier().wait();
}

// `fn` must throw an error whose text has `needle`: NCCL's rule `rule` fired.
void expect_refused(const std::string& rule, const std::string& needle, const std::function<void()>& fn) {
  std::string text;
  try {
    fn();
  } catch (const std::exception& e) {
    text = e.what();
  }
  if (text.empty()) throw Error("rule " + rule + ": nothing refused it");
  if (text.find(needle) == std::string::npos)
    throw Error("rule " + rule + ": refused, but the error does not say '" + needle + "': " + text);
  std::printf("rule %s fired: %s\n", rule.c_str(), text.substr(0, text.find('\n')).c_str());
}

// The rules of NCCL that sim's twin keeps, each broken on purpose (every rank breaks it alike, so
// the group stays in step), then kept.
void nccl_rules(Communicator& c) {
  const int w = c.size(), r = c.rank();
  const c10::Device other(g_device.type(), static_cast<c10::DeviceIndex>((g_device.index() + 1) % 8));
  expect_refused("host-tensor", "is a cpu tensor", [&] { c.all_reduce(at::ones({4}), ReduceOp::Sum).wait(); });
  expect_refused("other-device", "but this communicator's device is " + g_device.str(),
                 [&] { c.all_reduce(at::ones({4}).to(other), ReduceOp::Sum).wait(); });
  expect_refused("count-mismatch", "called different collectives", [&] {
    const int64_t n = r == 1 ? 999 : 1000;
    c.all_gather(dev(at::empty({n * w})), dev(at::ones({n}))).wait();
  });
  expect_refused("dtype-mismatch", "called different collectives", [&] {
    at::Tensor t = dev(at::ones({16}, r == 1 ? at::kBFloat16 : at::kFloat));
    c.all_reduce(t, ReduceOp::Sum).wait();
  });
  // A kernel on the output before the wait: the collective's stream may still be writing it.
  at::Tensor out = dev(at::empty({4 * w}));
  Work gather = c.all_gather(out, dev(at::ones({4})));
  expect_refused("touch-before-wait", "sim stream-order hazard", [&] { out.fill_(0); });
  gather.wait();
  // The output's bytes freed before the wait: the collective's stream may still be writing them.
  at::Tensor gathered = dev(at::empty({256 * w}));
  Work pending = c.all_gather(gathered, dev(at::ones({256})));
  free_now(gathered);
  pending.wait();
  expect_refused("free-before-wait", "may still use them", [&] { dev(at::ones({4})); });
  // The wait orders only the stream that waited: another stream must wait for that one after it.
  c10::impl::VirtualGuardImpl guard(g_device.type());
  const c10::Stream main = guard.getStream(g_device);
  const c10::Stream side = guard.getStreamFromGlobalPool(g_device, /*isHighPriority=*/false);
  at::Tensor t = dev(at::ones({8}));
  c10::Event before(g_device.type()), after(g_device.type());
  before.record(main);
  c.all_reduce(t, ReduceOp::Sum).wait();
  before.block(side);  // knows the ones() above, not the collective
  expect_refused("wait-orders-the-waiter-only", "sim stream-order hazard", [&] {
    c10::StreamGuard on(side);
    t.add_(1);
  });
  after.record(main);
  after.block(side);
  {
    c10::StreamGuard on(side);
    t.add_(1);  // now ordered after the collective
  }
  // Kept: the same collectives, waited for before the buffers are touched or freed.
  at::Tensor u = dev(at::ones({1024}));
  c.all_reduce(u, ReduceOp::Sum).wait();
  expect_equal(u, at::full({1024}, static_cast<double>(w)), "all_reduce after the rules were kept");
  free_now(u);
  at::Tensor g = dev(at::empty({4 * w}));
  c.all_gather(g, dev(at::full({4}, static_cast<double>(r)))).wait();
  g.add_(0);
  std::printf("rules kept: no error\n");
}

// Runs `scenario` on this rank; returns the exit status.
int run_scenario(const std::string& scenario, const RuntimeOptions& ro, const po::variables_map& vm) {
  const int rank = ro.topology.rank;
  if (scenario == "sleep") {
    std::ofstream(vm["dir"].as<std::string>() + "/pid." + std::to_string(rank)) << ::getpid() << "\n";
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  auto groups = ProcessGroups::create(ro);
  if (scenario == "collectives") {
    collectives(*groups->world());
    at::Tensor meta = at::full({1}, static_cast<double>(rank));  // metadata: on the CPU, over the control group
    groups->control()->all_reduce(meta, ReduceOp::Sum).wait();
    expect_equal(meta, at::full({1}, ro.topology.world_size * (ro.topology.world_size - 1) / 2.0),
                 "control all_reduce");
    std::printf("collectives ok on %s\n", g_device.str().c_str());
  } else if (scenario == "nccl-rules") {
    nccl_rules(*groups->world());
  } else if (scenario == "hybrid") {
    auto h = groups->hybrid(ro.topology.local_world_size);
    collectives(*h.shard);
    collectives(*h.replicate);
    // Which ranks are where: sum of global ranks in each group.
    at::Tensor s = at::full({1}, static_cast<double>(rank));
    h.shard->all_reduce(s, ReduceOp::Sum).wait();
    at::Tensor t = at::full({1}, static_cast<double>(rank));
    h.replicate->all_reduce(t, ReduceOp::Sum).wait();
    std::printf("hybrid ok shard=%d/%d sum=%g replicate=%d/%d sum=%g\n", h.shard->rank(), h.shard->size(),
                s.item<double>(), h.replicate->rank(), h.replicate->size(), t.item<double>());
  } else if (scenario == "subgroups") {
    // A group of some ranks, then groups of all: creation must agree per group, not per rank.
    if (rank < 2) {
      auto pair = groups->new_group("pair", {0, 1});
      at::Tensor t = at::ones({3});
      pair->all_reduce(t, ReduceOp::Sum).wait();
      expect_equal(t, at::full({3}, 2.0), "pair all_reduce");
    }
    auto h = groups->hybrid(2);
    at::Tensor s = at::full({1}, static_cast<double>(rank));
    h.shard->all_reduce(s, ReduceOp::Sum).wait();
    expect_equal(s, at::full({1}, rank < 2 ? 1.0 : 5.0), "shard all_reduce after a subset group");
    std::printf("subgroups ok\n");
  } else if (scenario == "die") {
    at::Tensor t = at::ones({1024});
    groups->world()->all_reduce(t, ReduceOp::Sum).wait();
    if (rank == 1) ::raise(SIGKILL);
    at::Tensor u = at::ones({1 << 20});
    groups->world()->all_reduce(u, ReduceOp::Sum).wait();
    std::printf("rank %d: the collective succeeded without rank 1\n", rank);
    return 0;
  } else if (scenario == "mismatch") {
    at::Tensor t = at::ones({4});
    groups->world()->all_reduce(t, ReduceOp::Sum).wait();
    const int64_t n = rank == vm["fail-rank"].as<int>() ? 999 : 1000;
    at::Tensor out = at::empty({n * ro.topology.world_size});
    groups->world()->all_gather(out, at::ones({n})).wait();
    std::printf("rank %d: the all-gather of mismatched sizes ran\n", rank);
  } else if (scenario == "lost") {
    groups->world()->barrier().wait();
    if (rank == vm["fail-rank"].as<int>()) ::raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(60));  // computing: no collective to fail
    std::printf("rank %d: still running 60 s after losing rank %d\n", rank, vm["fail-rank"].as<int>());
    return 1;
  } else if (scenario == "exit") {
    groups->world()->barrier().wait();
    if (rank == vm["fail-rank"].as<int>()) return vm["code"].as<int>();
    std::this_thread::sleep_for(std::chrono::seconds(120));
  } else {
    throw Error("unknown scenario '" + scenario + "'");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc;
  desc.add_options()("scenario", po::value<std::string>()->required(), "")
      ("rendezvous-timeout", po::value<double>()->default_value(30), "")
      ("collective-timeout", po::value<double>()->default_value(30), "")
      ("fail-rank", po::value<int>()->default_value(1), "")
      ("code", po::value<int>()->default_value(3), "")
      ("dir", po::value<std::string>(), "")
      ("device", po::value<std::string>()->default_value("cpu"), "")
      ("backend", po::value<std::string>()->default_value("default"), "")
      ("watch-peers", "")
      ("check-collectives", "");
  tool::main(argc, argv, "comm_worker", desc, [](const po::variables_map& vm) {
    RuntimeOptions ro;
    ro.topology = resolve_topology({}, process_environment()).topology;
    ro.rendezvous_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(vm["rendezvous-timeout"].as<double>() * 1000));
    ro.collective_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(vm["collective-timeout"].as<double>() * 1000));
    ro.check_collectives = vm.count("check-collectives") > 0;
    ro.watch_peers = vm.count("watch-peers") > 0;
    ro.exit_on_peer_failure = ro.watch_peers;
    ro.share_devices = share_gpus_from_environment();  // FSDPX_SHARE_GPUS=1: each rank poses as a node (NCCL)
    const std::string device = vm["device"].as<std::string>();
    if (device != "cpu") {
      g_device = open_device(device, ro.topology.local_rank)->device();
      ro.device = device == "cuda" ? DeviceKind::Cuda : DeviceKind::Sim;
    }
    ro.backend = vm["backend"].as<std::string>() == "gloo" ? Backend::Gloo : Backend::Default;
    return run_scenario(vm["scenario"].as<std::string>(), ro, vm);
  });
}
