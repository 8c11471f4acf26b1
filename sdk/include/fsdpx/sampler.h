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
#include <memory>
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

// A data set of `num_samples` indexed samples (a table's rows, a file's pairs) split once, from
// `split_seed` alone, into training samples and the last `holdout` fraction held out
// (fsdpx/evaluation.h's HeldOutData), with a GlobalBatchSampler over the training ones: what such
// a data source's DataSource and HeldOutData methods need, named by `source` in its errors.
//
//   SplitSamples split_(n, holdout, split_seed, "csv");
//   void open(const fsdpx::DataContext& ctx) override { split_.open(ctx); }
//   fsdpx::Batch next() override { return rows(split_.next()); }           // sample indices
//   fsdpx::Batch heldout(int64_t first, int64_t count) override { return rows(split_.heldout(first, count)); }
class FSDPX_API SplitSamples {
 public:
  // `holdout` in [0, 1). training() may be 0: the caller says what its data lacks.
  SplitSamples(int64_t num_samples, double holdout, uint64_t split_seed, std::string source);

  int64_t training() const { return training_; }
  int64_t held_out() const { return static_cast<int64_t>(order_.size()) - training_; }
  // Training sample t (0 .. training() - 1) as an index into the whole data set.
  int64_t training_sample(int64_t t) const { return order_[static_cast<size_t>(t)]; }

  // The sampler over the training samples, from the run's DataContext (batch, rank, world, seed).
  void open(int64_t batch_size, int rank, int world_size, uint64_t seed);
  // This rank's sample indices (into the whole data set) for the next step. fsdpx::Error before open().
  std::vector<int64_t> next();
  // The sampler's position ("{}" before open()), and its restoration (fsdpx::Error before open()).
  std::string state() const;
  void restore(const std::string& state);
  // Held-out samples first .. first + count - 1 as indices into the whole data set; fsdpx::Error
  // naming the range when it lies outside 0 .. held_out().
  std::vector<int64_t> heldout(int64_t first, int64_t count) const;

 private:
  std::string source_;
  std::vector<int64_t> order_;  // a permutation: training samples first
  int64_t training_ = 0;
  std::unique_ptr<GlobalBatchSampler> sampler_;
};

}  // namespace fsdpx
