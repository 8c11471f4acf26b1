// This machine's figures for the time model, probed once and cached (hardware.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ops/add.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/dtype_name.h"
#include "fsdpx/framework/runtime/c10d_backends.h"
#include "hardware.h"
#include "seconds_since.h"

namespace fsdpx {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A probe multiplies at most this many flops, so that even a slow dtype (bf16 without native
// bf16) takes tens of milliseconds: a larger matmul is timed on a slice of its rows (then of its
// columns) and scaled by its flops, which on these sizes run at the slice's rate.
constexpr double kProbeFlops = 2e8;
// Part of every cache key: a change to what a probe measures makes the figures of earlier ones stale.
constexpr const char* kProbesVersion = "probes 3";

std::filesystem::path cache_file() {
  if (const char* d = std::getenv("FSDPX_CACHE_DIR"); d && *d) return std::filesystem::path(d) / "probes.json";
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::filesystem::path(d) / "fsdpx/probes.json";
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home && *home ? home : "/tmp") / ".cache/fsdpx/probes.json";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

// The median of a few timed runs of `run`, after one untimed: where other ranks' threads share
// the cores, the fastest run would be one the scheduler happened to leave alone.
double typical_seconds(const std::function<void()>& run) {
  run();
  std::vector<double> runs;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    run();
    runs.push_back(seconds_since(t0));
  }
  std::nth_element(runs.begin(), runs.begin() + 2, runs.end());
  return runs[2];
}

void check(bool ok, const char* what) {
  if (!ok) throw Error(std::string("the loopback link probe could not ") + what + ": " + std::strerror(errno));
}

void send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    check(k > 0, "send");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    check(k > 0, "receive");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// Gloo's ranks on one machine talk over loopback TCP, and a ring step sends and receives at once:
// the bandwidth is what each end of a TCP connection sends while it receives as much.
double loopback_bytes_per_s() {
  const int server = ::socket(AF_INET, SOCK_STREAM, 0);
  check(server >= 0, "open a socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  check(::bind(server, reinterpret_cast<sockaddr*>(&addr), len) == 0 && ::listen(server, 1) == 0 &&
            ::getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
        "listen on 127.0.0.1");
  const int a = ::socket(AF_INET, SOCK_STREAM, 0);
  check(a >= 0 && ::connect(a, reinterpret_cast<sockaddr*>(&addr), len) == 0, "connect to 127.0.0.1");
  const int b = ::accept(server, nullptr, nullptr);
  check(b >= 0, "accept");
  ::close(server);
  constexpr size_t kBytes = size_t{32} << 20;
  std::vector<char> out_a(kBytes, 1), out_b(kBytes, 2), in_a(kBytes), in_b(kBytes);
  const auto t0 = Clock::now();
  std::vector<std::thread> ends;
  ends.emplace_back([&] { send_all(a, out_a.data(), kBytes); });
  ends.emplace_back([&] { send_all(b, out_b.data(), kBytes); });
  ends.emplace_back([&] { recv_all(a, in_a.data(), kBytes); });
  recv_all(b, in_b.data(), kBytes);
  for (auto& t : ends) t.join();
  const double bytes_per_s = static_cast<double>(kBytes) / seconds_since(t0);
  ::close(a);
  ::close(b);
  return bytes_per_s;
}

// Gloo as the ranks use it: two process groups of LibTorch's Gloo in this process, over an
// in-memory store, each all-gathering from a thread of its own. The latency is a one-float
// all-gather's: its thread hand-offs and socket round trip, the fixed cost of every collective.
// The bandwidth is the loopback's: the pair's own large all-gathers, both ranks' copies in one
// process, ran at 0.28 GB/s, a fifth of the loopback's 1.3, and so predicted six times the waits
// gpt small's two-rank runs measured.
LinkSpeed probe_gloo() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  constexpr int kSmall = 50;
  double small = 0;
  std::exception_ptr failed;
  auto rank = [&](int r) {
    try {
      auto gloo = make_gloo_backend(store, r, 2, std::chrono::seconds(5));
      auto gather = [&](int64_t n) {
        std::vector<at::Tensor> in{at::ones({n})};
        std::vector<std::vector<at::Tensor>> out{{at::empty({n}), at::empty({n})}};
        gloo->allgather(out, in)->wait();
      };
      gather(1);
      const auto t0 = Clock::now();
      for (int i = 0; i < kSmall; ++i) gather(1);
      if (r == 0) small = seconds_since(t0) / kSmall;
    } catch (...) {
      failed = std::current_exception();
    }
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  if (failed) std::rethrow_exception(failed);
  LinkSpeed link;
  link.latency_s = small;
  link.bytes_per_s = loopback_bytes_per_s();
  return link;
}

// The shape a probe times instead of `mm`: its batch, then its rows, then its columns halved
// while it multiplies more than kProbeFlops.
Matmul probe_shape(Matmul mm) {
  while (mm.flops() > kProbeFlops && mm.batch > 1) mm.batch = (mm.batch + 1) / 2;
  while (mm.flops() > kProbeFlops && mm.m > 64) mm.m = (mm.m + 1) / 2;
  while (mm.flops() > kProbeFlops && mm.n > 256) mm.n = (mm.n + 1) / 2;
  return mm;
}

// One run of `mm`'s pass as autograd runs it for a linear layer (the weight stored [n, k]) or a
// batched product.
double time_matmul(const Matmul& mm, c10::ScalarType dtype, MatmulPass pass) {
  const auto o = at::TensorOptions().dtype(dtype);
  if (mm.batch > 1) {
    const at::Tensor x = at::randn({mm.batch, mm.m, mm.k}, o), y = at::randn({mm.batch, mm.k, mm.n}, o);
    const at::Tensor g = at::randn({mm.batch, mm.m, mm.n}, o);
    if (pass == MatmulPass::Forward) return typical_seconds([&] { at::bmm(x, y); });
    if (pass == MatmulPass::InputGrad) return typical_seconds([&] { at::bmm(g, y.transpose(1, 2)); });
    return typical_seconds([&] { at::bmm(x.transpose(1, 2), g); });
  }
  const at::Tensor x = at::randn({mm.m, mm.k}, o), w = at::randn({mm.n, mm.k}, o), g = at::randn({mm.m, mm.n}, o);
  if (pass == MatmulPass::Forward) return typical_seconds([&] { at::mm(x, w.t()); });
  if (pass == MatmulPass::InputGrad) return typical_seconds([&] { at::mm(g, w); });
  return typical_seconds([&] { at::mm(g.t(), x); });
}

// scaled_dot_product_attention as gpt calls it; its backward timed by autograd, as the difference
// between a forward-and-backward and a forward.
double time_attention(const Attention& a, c10::ScalarType dtype, bool backward) {
  const auto o = at::TensorOptions().dtype(dtype);
  const at::Tensor q = at::randn({a.batch, a.heads, a.seq, a.head_dim}, o).requires_grad_(backward);
  const at::Tensor k = at::randn({a.batch, a.heads, a.seq, a.head_dim}, o).requires_grad_(backward);
  const at::Tensor v = at::randn({a.batch, a.heads, a.seq, a.head_dim}, o).requires_grad_(backward);
  auto forward = [&] { return at::scaled_dot_product_attention(q, k, v, {}, 0.0, a.causal); };
  const double f = typical_seconds([&] { forward(); });
  if (!backward) return f;
  const at::Tensor g = at::randn({a.batch, a.heads, a.seq, a.head_dim}, o);
  return std::max(0.0, typical_seconds([&] { forward().backward(g); }) - f);
}

// What a kernel costs besides its bytes: a chain of products of single elements, forward, then
// forward and backward through autograd; per kernel.
std::pair<double, double> time_kernels() {
  constexpr int kChain = 200;
  const at::Tensor w = at::randn({1}).requires_grad_(true);
  auto chain = [&] {
    at::Tensor y = w;
    for (int i = 0; i < kChain; ++i) y = y * 1.0001;
    return y;
  };
  const double f = typical_seconds([&] { chain(); });
  const double fb = typical_seconds([&] { chain().backward(); });
  return {f / kChain, std::max(0.0, fb - f) / kChain};
}

// Runs the probes with the rank's threads, and gives the process's back after.
class ThreadsFor {
 public:
  explicit ThreadsFor(int threads) : before_(at::get_num_threads()) { at::set_num_threads(threads); }
  ~ThreadsFor() { at::set_num_threads(before_); }

 private:
  int before_;
};

class ProbedCpu final : public Hardware {
 public:
  ProbedCpu(int threads, int ranks) : threads_(threads), ranks_(ranks), path_(cache_file()) {
    machine_ = std::string(kProbesVersion) + "|" + cpu_model() + "|" + std::to_string(ranks) + " rank(s) x " +
               std::to_string(threads) + " thread(s)|" + at::get_cpu_capability();
    std::ifstream in(path_);
    cache_ = json::parse(in, nullptr, false);
    if (!cache_.is_object()) cache_ = json::object();
    memory_bytes_per_s = 3.0 * (int64_t{16} << 20) / cached("memory", [] {
                           const at::Tensor x = at::randn({int64_t{4} << 20}), y = at::randn({int64_t{4} << 20});
                           at::Tensor z = at::empty_like(x);
                           return typical_seconds([&] { at::add_out(z, x, y); });
                         });
    forward_kernel_s = cached("kernel forward", [] { return time_kernels().first; });
    backward_kernel_s = cached("kernel backward", [] { return time_kernels().second; });
    node.latency_s = cached(
        "gloo latency", [this] { return gloo().latency_s; }, false);
    node.bytes_per_s = cached(
        "gloo bandwidth", [this] { return gloo().bytes_per_s; }, false);
    network = node;
    what = "this machine, probed (" + machine_ + "; cached in " + path_.string() + ")";
  }
  ~ProbedCpu() override { save(); }

  double peak_flops(c10::ScalarType dtype) override {
    const Matmul square{1024, 1024, 1024};
    return square.flops() / matmul_seconds(square, dtype, MatmulPass::Forward);
  }

  // Timed on as many samples and heads as fit the probe's flops, scaled to all of them.
  double attention_seconds(const Attention& a, c10::ScalarType dtype, bool backward) override {
    if (a.flops() <= 0) return 0;
    Attention p = a;
    while (p.flops() > kProbeFlops && p.batch > 1) p.batch = (p.batch + 1) / 2;
    while (p.flops() > kProbeFlops && p.heads > 1) p.heads = (p.heads + 1) / 2;
    const std::string key = "attention " + dtype_name(dtype) + (backward ? " backward " : " forward ") +
                            std::to_string(p.batch) + "x" + std::to_string(p.heads) + "x" + std::to_string(p.seq) +
                            "x" + std::to_string(p.head_dim) + (p.causal ? " causal" : "");
    return cached(key, [&] { return time_attention(p, dtype, backward); }) * a.flops() / p.flops();
  }

  double matmul_seconds(const Matmul& mm, c10::ScalarType dtype, MatmulPass pass) override {
    if (mm.flops() <= 0) return 0;
    const Matmul p = probe_shape(mm);
    const std::string key = "mm " + dtype_name(dtype) + " " + std::to_string(static_cast<int>(pass)) + " " +
                            std::to_string(p.m) + "x" + std::to_string(p.k) + "x" + std::to_string(p.n) + "x" +
                            std::to_string(p.batch);
    return cached(key, [&] { return time_matmul(p, dtype, pass); }) * mm.flops() / p.flops();
  }

 private:
  const LinkSpeed& gloo() {
    if (!link_) link_ = probe_gloo();
    return *link_;
  }
  // `probe`'s result under `key`, probed now (by every rank's thread at once when `shared`) unless
  // the cache has it.
  double cached(const std::string& key, const std::function<double()>& probe, bool shared = true) {
    json& mine = cache_[machine_];
    if (mine.contains(key) && mine[key].is_number() && mine[key].get<double>() > 0) return mine[key].get<double>();
    ThreadsFor t(threads_);
    // The other ranks' threads keep probing until this one has its figure: its every timed run
    // shares the cores with all of them.
    std::atomic<bool> done{false};
    std::vector<std::thread> others;
    for (int r = 1; shared && r < ranks_; ++r)
      others.emplace_back([&] {
        ThreadsFor mine_too(threads_);
        do probe();
        while (!done.load());
      });
    if (!others.empty()) probe();  // while the others start
    const double seconds = probe();
    done = true;
    for (auto& o : others) o.join();
    mine[key] = seconds;
    dirty_ = true;
    return seconds;
  }
  // Written whole to a file of its own, then renamed: ranks probing at once never mix their writes.
  void save() noexcept {
    if (!dirty_) return;
    try {
      std::filesystem::create_directories(path_.parent_path());
      const auto tmp = path_.string() + "." + std::to_string(::getpid());
      std::ofstream(tmp) << cache_.dump(1) << "\n";
      std::filesystem::rename(tmp, path_);
    } catch (const std::exception&) {  // an unwritable cache only costs the next plan its probes
    }
  }

  int threads_, ranks_;
  std::filesystem::path path_;
  std::string machine_;
  json cache_;
  bool dirty_ = false;
  std::optional<LinkSpeed> link_;
};

}  // namespace

std::unique_ptr<Hardware> probe_this_machine(int threads, int ranks) {
  return std::make_unique<ProbedCpu>(threads, std::max(1, ranks));
}

double optimizer_seconds_per_element(Optimizer& opt, c10::ScalarType storage, c10::ScalarType gradient, int threads) {
  constexpr int64_t n = int64_t{1} << 20;  // its state and shards beyond the cores' own caches, as a model's are
  ThreadsFor t(threads);
  at::Tensor param = at::zeros({n}, at::TensorOptions().dtype(storage));
  param.set_requires_grad(true);
  param.mutable_grad() = at::full({n}, 1e-3, at::TensorOptions().dtype(gradient));
  opt.init({ParamShard{"probe", param}});
  const double seconds = typical_seconds([&] { opt.step(0.0); }) / static_cast<double>(n);
  // The instance goes on to the run, which keeps what it holds under this name: it is left as the
  // plan's bytes probe left it, with a few thousand elements' state, not a million's.
  constexpr int64_t kept = 4096;
  at::Tensor small = at::zeros({kept}, at::TensorOptions().dtype(storage));
  small.set_requires_grad(true);
  small.mutable_grad() = at::full({kept}, 1e-3, at::TensorOptions().dtype(gradient));
  opt.init({ParamShard{"probe", small}});
  opt.step(0.0);
  return seconds;
}

}  // namespace fsdpx
