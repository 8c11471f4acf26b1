// fsdpx/data_source.h: a distributed, resumable stream of batches. fsdpx::GlobalBatchSampler
// (fsdpx/sampler.h) gives each rank its sample indices and the position to checkpoint; sdk/README.md
// shows a data source built on it.
#pragma once

#include <cstdint>
#include <string>

#include "fsdpx/component.h"
#include "fsdpx/export.h"
#include "fsdpx/model.h"

namespace fsdpx {

struct DataContext {
  int rank = 0;
  int world_size = 1;
  int64_t batch_size = 1;  // samples per rank per micro-batch
  uint64_t seed = 0;
};

class FSDPX_API DataSource {
 public:
  static constexpr Kind kKind = Kind::Data;
  virtual ~DataSource();

  // Prepares this rank's stream. The global batch of step s (the union over ranks) must be the
  // same set of samples at every world size for the same global batch size, and the ranks'
  // shares must be disjoint. Throws fsdpx::Error on missing or too small data. Called once per
  // instance, before anything but num_samples(). (The plan before a run opens an instance of its
  // own as rank 0 would and reads one batch, to catch bad data before any worker starts.)
  virtual void open(const DataContext& ctx) = 0;
  // This rank's next micro-batch.
  virtual Batch next() = 0;
  // Samples in one epoch of the whole data set.
  virtual int64_t num_samples() const = 0;
  // The stream position as a JSON object (text), and its restoration (for checkpoints). On
  // resume, restore() comes after open() and before the first next(), with what state() returned
  // in the run that saved; it throws fsdpx::Error for a position it cannot take.
  virtual std::string state() const = 0;
  virtual void restore(const std::string& state) = 0;
};

}  // namespace fsdpx
