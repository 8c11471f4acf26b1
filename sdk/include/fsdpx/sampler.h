// fsdpx/sampler.h: which samples each rank reads at each step, the same global batches at every
// world size. A data source (fsdpx/data_source.h) builds one in open() from its DataContext and
// asks it for this rank's sample indices at each next(); its state() is the data position that
// checkpoints keep.
//
//   void open(const fsdpx::DataContext& ctx) override {
//     sampler_ = std::make_unique<fsdpx::GlobalBatchSampler>(num_samples(), ctx.batch_size * ctx.world_size,
//                                                            ctx.rank, ctx.world_size, ctx.seed);
//   }
//   fsdpx::Batch next() override { return batch_of(sampler_->next()); }   // this rank's indices
//   std::string state() const override { return sampler_->state(); }
//   void restore(const std::string& s) override { sampler_->restore(s); }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdpx/export.h"

namespace fsdpx {

// Epoch e is a permutation of the data set's sample indices, shuffled from (seed, e) alone.
// Step s of an epoch takes the s-th run of `global_batch` indices of that permutation (an
// incomplete last run is dropped); rank r of W reads the r-th of W equal slices of it. So the
// union over ranks of step s is the same set at any world size with the same global batch, and
// the ranks' slices are disjoint. The position (epoch, step) is the whole state.
class FSDPX_API GlobalBatchSampler {
 public:
  // Throws fsdpx::Error if the global batch does not split evenly over the ranks or is larger
  // than the data set.
  GlobalBatchSampler(int64_t num_samples, int64_t global_batch, int rank, int world_size, uint64_t seed,
                     bool shuffle = true);

  // This rank's sample indices for the next step (global_batch / world_size of them); advances
  // the position. Past the last step of an epoch, the next epoch begins.
  std::vector<int64_t> next();

  int64_t steps_per_epoch() const { return num_samples_ / global_batch_; }
  // {"epoch": e, "step": s} as JSON text, and its restoration (throws fsdpx::Error naming a
  // position that is not of this form or lies outside this data set).
  std::string state() const;
  void restore(const std::string& state);

 private:
  void shuffle_epoch();
  int64_t num_samples_, global_batch_;
  int rank_, world_;
  uint64_t seed_;
  bool shuffle_;
  int64_t epoch_ = 0, step_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace fsdpx
