// Saves staged through a bounded pool of host memory and written by a thread of their own
// (a StreamedCheckpointBackend's saves, fsdpx/checkpoint_backend.h): the training thread stalls
// only while it copies the state into the pool; the writer writes and fsyncs, and the backend's
// commit protocol decides completeness.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/export.h"

namespace fsdpx {

class DeviceRuntime;

// Host buffers a save stages through: capacity / buffer_bytes buffers (at least one), allocated
// when first needed and kept for the next save (pinned where `host` says so). acquire() waits
// while every buffer is in use. Thread-safe.
class FSDPX_API StagingPool {
 public:
  StagingPool(int64_t capacity, int64_t buffer_bytes, at::TensorOptions host);
  int64_t capacity() const { return buffer_bytes_ * max_buffers_; }
  int64_t buffer_bytes() const { return buffer_bytes_; }
  int64_t allocated_bytes() const;  // what the pool holds now
  at::Tensor acquire();             // a kByte buffer of buffer_bytes()
  bool exhausted() const;           // acquire() would wait for a release
  void fill();                      // every buffer allocated and its pages touched
  void release(at::Tensor buffer);

 private:
  const int64_t buffer_bytes_, max_buffers_;
  const at::TensorOptions host_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<at::Tensor> free_;
  int64_t allocated_ = 0;  // buffers
};

// The staging pool's layout for a rank writing `rank_bytes` whose widest row is `widest_row`
// bytes, bounded by `limit`: buffers of 64 MiB (or of the widest row, when wider; never more than
// the bound), as many as the rows fill (each buffer may leave less than a row unused). The saver
// allocates this; the run plan states it.
struct PoolLayout {
  int64_t buffer_bytes = 0, pool_bytes = 0;
};
FSDPX_API PoolLayout staging_pool_layout(int64_t limit, int64_t rank_bytes, int64_t widest_row);

// One save's figures. stall: the training thread's time in save() (the slowest rank's: every
// rank waits for it at the next collective), less the wait for the previous save, plus (staging
// deferred) settle()'s wait for the staging thread; wait: how long save() first waited for the
// save before it; write: from staging's start until the checkpoint was complete (this rank's view;
// on rank 0 the whole save); stage: the copy into the pool, this rank's (deferred: on its own
// thread while training went on).
struct SaveFigures {
  int64_t step = 0;
  std::string dir;
  bool background = false;
  bool deferred = false;  // staged on a thread of its own (save()'s defer_staging)
  double stall_s = 0, wait_s = 0, write_s = 0, stage_s = 0;
  int64_t staged_bytes = 0;  // this rank's bytes through the pool
};

class FSDPX_API CheckpointSaver {
 public:
  // `main`: the context of the training thread (its collectives); `background`: a context over a
  // group of its own (ProcessGroups::new_control_group) that only the writer thread uses, for
  // backends that save in the background; `device`: where the state lives (copies from it run on
  // its current stream). `on_complete` runs on the writer thread of every rank once the save is
  // complete on every rank (rank 0: pruning).
  CheckpointSaver(StreamedCheckpointBackend& backend, CheckpointContext main, CheckpointContext background,
                  std::shared_ptr<const DeviceRuntime> device);
  ~CheckpointSaver();  // a save in flight is abandoned (its temporary directory stays incomplete)
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  bool background() const { return backend_.saves_in_background(); }
  // The pool's bound (the backend's staging_bytes()), and what it holds now: made at the first
  // save, of the bound or of this rank's staged bytes (rounded up to a MiB) when they are fewer.
  int64_t pool_limit() const { return backend_.staging_bytes(); }
  int64_t pool_allocated() const { return pool_ ? pool_->allocated_bytes() : 0; }

  // Sizes the pool for `st` (this rank's rows of it) and allocates it now, its pages touched, so
  // that the first save stages into memory as fast as the next ones (before training starts).
  // Throws as save() does for a row larger than the pool.
  void reserve(const CheckpointState& st);
  // Saves `st` under `dir`: waits for the save in flight, begins (collective over `main`), stages
  // every row this rank writes into the pool and hands each full buffer to the writer. Returns
  // once staged in the background, else once complete. Throws fsdpx::Error when a row of a tensor
  // is larger than the whole pool (naming the tensor and the size needed; every rank alike),
  // and, like wait(), with the failure of the save before.
  // `defer_staging` (a background save of host memory; ignored otherwise): the staging runs on a
  // thread of its own and save() returns once it has begun, so the copy overlaps what the caller
  // does next; the caller calls settle() before anything writes `st`'s tensors (the optimizer's
  // next step), on every rank at the same point.
  void save(const std::string& dir, const CheckpointState& st, std::function<void()> on_complete = {},
            bool defer_staging = false);
  // Waits for a deferred staging to finish, and takes the slowest rank's stall (collective over
  // `main` once per deferred save, on every rank alike: each rank deferred the same save, whether
  // or not in_flight() or wait() joined its staging first). Nothing when no save was deferred.
  void settle();
  // Whether a save is still being written. One that finished is joined: its failure is thrown
  // (fsdpx::Error, one line naming the checkpoint), its figures kept for take_finished().
  bool in_flight();
  // Waits for the save in flight (if any), then as in_flight().
  void wait();
  // The figures of the saves finished since the last call, oldest first.
  std::vector<SaveFigures> take_finished();
  // The save in flight ("" when none).
  std::string in_flight_dir() const;

  struct Flight;  // one save between save() and its join, shared with its writer thread

 private:
  void prepare(const CheckpointState& st, const std::string& what);
  void stage(Flight& f, const CheckpointState& st, const std::vector<size_t>& mine);
  double slowest(double seconds) const;  // the largest over `main`'s ranks (collective)
  void join_stager();                    // the deferred staging, joined (its stall this rank's)
  void join();

  StreamedCheckpointBackend& backend_;
  const CheckpointContext main_, background_;
  std::shared_ptr<const DeviceRuntime> device_;
  std::shared_ptr<StagingPool> pool_;  // null before the first save
  std::shared_ptr<Flight> flight_;
  std::thread writer_;
  std::thread stager_;        // a deferred staging
  bool unsettled_ = false;    // a deferred save that settle() has not yet seen
  double save_call_s_ = 0;    // the deferred save's time in save()
  double stager_wait_s_ = 0;  // join_stager()'s wait for it
  std::vector<SaveFigures> finished_;
};

}  // namespace fsdpx
