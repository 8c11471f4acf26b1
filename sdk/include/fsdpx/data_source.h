// fsdpx/data_source.h: a distributed, resumable stream of batches.
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
  // shares must be disjoint. Throws fsdpx::Error on missing or too small data.
  virtual void open(const DataContext& ctx) = 0;
  // This rank's next micro-batch.
  virtual Batch next() = 0;
  // Samples in one epoch of the whole data set.
  virtual int64_t num_samples() const = 0;
  // The stream position as JSON text, and its restoration (for checkpoints).
  virtual std::string state() const = 0;
  virtual void restore(const std::string& state) = 0;
};

}  // namespace fsdpx
