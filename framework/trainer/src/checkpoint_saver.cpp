#include "fsdpx/framework/trainer/checkpoint_saver.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <system_error>
#include <thread>

#include <unistd.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/fault_injection.h"
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/framework/runtime/collective_context.h"
#include "fsdpx/framework/runtime/device.h"
#include "seconds_since.h"

namespace fsdpx {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kMaxBufferBytes = int64_t{64} << 20;

std::string mib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return b;
}

int64_t row_bytes(const TensorShard& t) {
  return row_numel(t.global_shape) * static_cast<int64_t>(t.local.element_size());
}

// While a background save is in flight on rank 0, SIGINT and SIGTERM (the launcher passes them
// on) first say that it is left incomplete: the process ends at once, as without the handler,
// and its temporary directory never looks complete.
char g_signal_note[600];
struct sigaction g_old_int, g_old_term;
bool g_handlers_set = false;

void note_and_end(int sig) {
  const ssize_t unused = ::write(2, g_signal_note, std::strlen(g_signal_note));
  (void)unused;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void set_signal_note(const std::string& dir) {
  const std::string tmp = (std::filesystem::path(dir).parent_path() /
                           (".tmp-" + std::filesystem::path(dir).filename().string())).string();
  std::snprintf(g_signal_note, sizeof g_signal_note,
                "fsdpx: checkpoint %s is left incomplete (%s): stopped by a signal while it was being written in the "
                "background; --resume auto takes the checkpoint before it\n",
                dir.c_str(), tmp.c_str());
  if (g_handlers_set) return;
  struct sigaction sa {};
  sa.sa_handler = note_and_end;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  g_handlers_set = true;
}

void clear_signal_note() {
  if (!g_handlers_set) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  g_handlers_set = false;
}

}  // namespace

StagingPool::StagingPool(int64_t capacity, int64_t buffer_bytes, at::TensorOptions host)
    : buffer_bytes_(std::max<int64_t>(1, buffer_bytes)),
      max_buffers_(std::max<int64_t>(1, capacity / std::max<int64_t>(1, buffer_bytes))),
      host_(host.dtype(at::kByte)) {}

int64_t StagingPool::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocated_ * buffer_bytes_;
}

void StagingPool::fill() {
  std::vector<at::Tensor> fresh;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (; allocated_ < max_buffers_; ++allocated_) fresh.push_back(at::empty({buffer_bytes_}, host_));
  }
  for (at::Tensor& b : fresh) {
    std::memset(b.data_ptr(), 0, static_cast<size_t>(buffer_bytes_));  // its pages now, not during a save
    release(std::move(b));
  }
}

bool StagingPool::exhausted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return free_.empty() && allocated_ >= max_buffers_;
}

at::Tensor StagingPool::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (free_.empty() && allocated_ < max_buffers_) {
    ++allocated_;
    lock.unlock();
    return at::empty({buffer_bytes_}, host_);
  }
  freed_.wait(lock, [&] { return !free_.empty(); });
  at::Tensor b = std::move(free_.back());
  free_.pop_back();
  return b;
}

void StagingPool::release(at::Tensor buffer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(buffer));
  }
  freed_.notify_one();
}

// One save between save() and its join: the buffers staged and not yet written, the writer's
// outcome. Shared with the writer thread.
struct CheckpointSaver::Flight {
  struct Piece {
    size_t tensor;
    int64_t offset, rows;  // bytes into the buffer, rows of the tensor
  };
  struct Chunk {
    at::Tensor buffer;
    std::vector<Piece> pieces;
  };
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<Chunk> chunks;
  bool staged = false;              // every chunk handed over
  bool hurry = false;               // staging waits for a buffer: write what is staged now
  std::string stage_error;          // why staging stopped ("" when it did not)
  std::atomic<bool> abandon{false};  // the saver is going away: write nothing more
  std::atomic<bool> done{false};
  std::string error;  // the writer's outcome, read after done
  SaveFigures figures;
  Clock::time_point start = Clock::now();

  void push(Chunk c) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      chunks.push_back(std::move(c));
    }
    ready.notify_one();
  }
  void close(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      staged = true;
      stage_error = why;
    }
    ready.notify_one();
  }
  void need_buffers() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      hurry = true;
    }
    ready.notify_one();
  }
  // The next chunk, or none once staging has closed and every chunk is taken. While the pool has
  // room, the writer starts only when staging is done: it would take the CPU staging needs.
  bool pop(Chunk& c) {
    std::unique_lock<std::mutex> lock(mutex);
    ready.wait(lock, [&] { return (!chunks.empty() && (staged || hurry)) || staged; });
    if (chunks.empty()) return false;
    c = std::move(chunks.front());
    chunks.pop_front();
    return true;
  }
};

namespace {

// The writer thread's work: every staged chunk through `w` (each buffer back to the pool once
// written, or once a failure means nothing more is written), then the backend's finish over
// `ctx`, whose agreement makes the checkpoint complete on every rank or on none.
void write_flight(CheckpointSaver::Flight& f, CheckpointWriter& w, const CheckpointContext& ctx, StagingPool& pool,
                  const std::function<void()>& on_complete) {
  CollectivePhase phase("checkpoint");
  std::string error;
  CheckpointSaver::Flight::Chunk c;
  while (f.pop(c)) {
    try {
      if (error.empty() && f.abandon) error = "the run stopped before it was written";
      if (error.empty())
        for (const auto& p : c.pieces)
          w.write_rows(p.tensor, static_cast<const char*>(c.buffer.data_ptr()) + p.offset, p.rows);
    } catch (const std::exception& e) {
      error = e.what();
    }
    pool.release(std::move(c.buffer));
  }
  if (error.empty()) error = f.stage_error;
  try {
    w.finish(ctx, error);
    if (on_complete) on_complete();
  } catch (const std::exception& e) {
    f.error = e.what();
  }
  f.figures.write_s = seconds_since(f.start);
  f.done = true;
}

}  // namespace

CheckpointSaver::CheckpointSaver(StreamedCheckpointBackend& backend, CheckpointContext main,
                                 CheckpointContext background, std::shared_ptr<const DeviceRuntime> device)
    : backend_(backend),
      main_(std::move(main)),
      background_(std::move(background)),
      device_(std::move(device)) {}

CheckpointSaver::~CheckpointSaver() {
  if (!writer_.joinable()) return;
  flight_->abandon = true;  // the writer drains what is staged without writing it, then fails the save
  if (stager_.joinable()) stager_.join();  // it stops at its next tensor
  writer_.join();
  clear_signal_note();
  if (main_.rank == 0 && !flight_->error.empty())
    std::fprintf(stderr, "fsdpx: checkpoint %s is left incomplete: the run stopped while it was being written\n",
                 flight_->figures.dir.c_str());
}

void CheckpointSaver::save(const std::string& dir, const CheckpointState& st, std::function<void()> on_complete,
                           bool defer_staging) {
  const auto t0 = Clock::now();
  wait();
  const double waited = seconds_since(t0);
  prepare(st, "checkpoint " + dir);
  CollectivePhase phase("checkpoint");
  auto flight = std::make_shared<Flight>();
  flight->start = Clock::now();
  flight->figures.step = st.step;
  flight->figures.dir = dir;
  flight->figures.background = background();
  flight->figures.wait_s = waited;
  std::shared_ptr<CheckpointWriter> w = backend_.begin_save(dir, st, main_);
  flight_ = flight;
  const CheckpointContext ctx = background() ? background_ : main_;  // a waiting training thread calls nothing
  std::vector<size_t> mine;
  for (size_t i = 0; i < st.tensors.size(); ++i)
    if (w->writes(i)) mine.push_back(i);
  writer_ = std::thread([flight, w, ctx, pool = pool_, on_complete = std::move(on_complete)] {
    write_flight(*flight, *w, ctx, *pool, on_complete);
  });
  if (background() && main_.rank == 0) set_signal_note(dir);
  if (defer_staging && background() && (!device_ || device_->is_cpu())) {
    try {
      stager_ = std::thread([this, flight, st, mine] {  // `st` by value: its tensors stay alive
        const auto began = Clock::now();
        stage(*flight, st, mine);
        flight->figures.stage_s = seconds_since(began);
      });
      flight->figures.deferred = unsettled_ = true;
      save_call_s_ = seconds_since(flight->start);
      stager_wait_s_ = 0;
      return;
    } catch (const std::system_error&) {  // no thread to be had: staged here, as on a device
    }
  }
  stage(*flight, st, mine);
  flight->figures.stage_s = seconds_since(flight->start);
  flight->figures.stall_s = slowest(seconds_since(flight->start));
  if (!background()) wait();
}

double CheckpointSaver::slowest(double seconds) const {
  if (!main_.all_sum || main_.world_size <= 1) return seconds;  // every rank waits for the slowest next
  std::vector<int64_t> us(static_cast<size_t>(main_.world_size), 0);
  us[static_cast<size_t>(main_.rank)] = static_cast<int64_t>(seconds * 1e6);
  main_.all_sum(us);
  return static_cast<double>(*std::max_element(us.begin(), us.end())) / 1e6;
}

void CheckpointSaver::settle() {
  if (!unsettled_) return;  // set by a deferred save on every rank alike, so the collective is too
  unsettled_ = false;
  const auto t0 = Clock::now();
  double waited = 0;
  if (stager_.joinable()) {
    stager_.join();
    waited = seconds_since(t0);
  } else {
    waited = stager_wait_s_;  // in_flight() or wait() joined it first
  }
  const double stall = slowest(save_call_s_ + waited);
  if (flight_) flight_->figures.stall_s = stall;
  else if (!finished_.empty()) finished_.back().stall_s = stall;
}

void CheckpointSaver::join_stager() {
  if (!stager_.joinable()) return;
  const auto t0 = Clock::now();
  stager_.join();
  stager_wait_s_ = seconds_since(t0);
  flight_->figures.stall_s = save_call_s_ + stager_wait_s_;
}

void CheckpointSaver::prepare(const CheckpointState& st, const std::string& what) {
  // Refused before anything begins, on every rank alike: a row larger than the pool. Buffers are
  // of 64 MiB, or of the widest row when it is wider, and never more than the pool.
  const auto mib_up = [](int64_t bytes) { return ((bytes + (1 << 20) - 1) >> 20) << 20; };
  int64_t total = 0, widest = 1;
  for (const TensorShard& t : st.tensors) {
    if (row_bytes(t) > pool_limit())
      throw Error(what + ": a row of tensor '" + t.name + "' is " + mib(row_bytes(t)) +
                  ", more than the staging pool (" + mib(pool_limit()) +
                  "); raise the checkpoint's pool_mib to at least " + std::to_string(mib_up(row_bytes(t)) >> 20));
    total += rows_of(t.local) * row_bytes(t);
    widest = std::max(widest, row_bytes(t));
  }
  if (pool_) return;
  const PoolLayout layout = staging_pool_layout(pool_limit(), total, widest);
  pool_ = std::make_shared<StagingPool>(layout.pool_bytes, layout.buffer_bytes,
                                        device_ && !device_->is_cpu() ? device_->host_options() : at::TensorOptions());
}

PoolLayout staging_pool_layout(int64_t limit, int64_t rank_bytes, int64_t widest_row) {
  const auto mib_up = [](int64_t bytes) { return ((bytes + (1 << 20) - 1) >> 20) << 20; };
  const int64_t widest = std::max<int64_t>(1, widest_row), total = rank_bytes;
  // One buffer of the rows' size when they are fewer than a buffer.
  const int64_t buffer =
      std::min({limit, std::max(kMaxBufferBytes, mib_up(widest)), mib_up(std::max<int64_t>(total, 1) + widest)});
  const int64_t buffers = (total + (buffer - widest) - 1) / std::max<int64_t>(1, buffer - widest);
  return PoolLayout{buffer, std::min(limit, std::max<int64_t>(1, buffers) * buffer)};
}

void CheckpointSaver::reserve(const CheckpointState& st) {
  prepare(st, "checkpoints");
  pool_->fill();
}

namespace {

// FSDPX_FAULT=slow-stage:R:MS (fsdpx/framework/base/fault_injection.h): how long rank R's
// background staging sleeps before each tensor (0: no fault).
std::chrono::milliseconds slow_stage(int rank) {
  const std::optional<Fault> f = requested_fault();
  if (!f || f->point != "slow-stage" || f->rank != rank) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::atoll(f->where.c_str()));
}

}  // namespace

// This rank's rows of the tensors `mine`, in order, into pool buffers; each buffer goes to the
// writer when full (a tensor larger than a buffer goes in several). A failure closes the flight
// with its message, which the writer's finish then spreads to every rank.
void CheckpointSaver::stage(Flight& f, const CheckpointState& st, const std::vector<size_t>& mine) {
  at::NoGradGuard no_grad;
  Flight::Chunk chunk;
  int64_t used = 0;
  const int64_t capacity = pool_->buffer_bytes();
  const auto slow = background() ? slow_stage(main_.rank) : std::chrono::milliseconds(0);
  try {
    for (size_t i : mine) {
      if (f.abandon) throw Error("the run stopped before it was staged");
      if (slow.count() > 0) std::this_thread::sleep_for(slow);
      const TensorShard& t = st.tensors[i];
      const at::Tensor rows = t.local.dim() == 0 ? t.local.reshape({1}) : t.local;
      const int64_t rb = row_bytes(t), n = rows_of(t.local);
      for (int64_t done = 0; done < n;) {
        if (chunk.buffer.defined() && capacity - used < rb) {
          f.push(std::move(chunk));
          chunk = Flight::Chunk();
        }
        if (!chunk.buffer.defined()) {
          if (pool_->exhausted()) f.need_buffers();
          chunk.buffer = pool_->acquire();
          used = 0;
        }
        const int64_t take = std::min(n - done, (capacity - used) / rb);
        std::vector<int64_t> shape = rows.sizes().vec();
        shape[0] = take;
        char* dst = static_cast<char*>(chunk.buffer.data_ptr()) + used;
        at::from_blob(dst, shape, rows.options().device(at::kCPU)).copy_(rows.narrow(0, done, take));
        chunk.pieces.push_back({i, used, take});
        used += take * rb;
        done += take;
      }
      f.figures.staged_bytes += n * rb;
    }
    if (chunk.buffer.defined()) f.push(std::move(chunk));
    f.close("");
  } catch (const std::exception& e) {
    if (chunk.buffer.defined()) pool_->release(std::move(chunk.buffer));
    f.close("checkpoint " + f.figures.dir + ": staging failed: " + e.what());
  }
}

bool CheckpointSaver::in_flight() {
  if (!writer_.joinable()) return false;
  if (!flight_->done) return true;
  join();
  return false;
}

void CheckpointSaver::wait() {
  if (writer_.joinable()) join();
}

void CheckpointSaver::join() {
  join_stager();  // settle()d already on the normal path; else this rank's stall
  writer_.join();
  clear_signal_note();
  std::shared_ptr<Flight> f = std::move(flight_);
  if (!f->error.empty()) throw Error(f->error);
  finished_.push_back(f->figures);
}

std::vector<SaveFigures> CheckpointSaver::take_finished() {
  std::vector<SaveFigures> out;
  out.swap(finished_);
  return out;
}

std::string CheckpointSaver::in_flight_dir() const { return writer_.joinable() ? flight_->figures.dir : ""; }

}  // namespace fsdpx
