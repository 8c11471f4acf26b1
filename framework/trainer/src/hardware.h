// The machines a step's time is predicted on (step_costs.h): how fast they multiply matrices,
// move memory and communicate. Either this machine's CPU, probed (short timed runs, cached per
// machine), or the accelerators a cluster file describes (--cluster FILE, configs/clusters/).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/ScalarType.h>

#include "fsdpx/layer_work.h"
#include "fsdpx/optimizer.h"

namespace fsdpx {

// A collective's link: `steps` latencies and the bytes this rank sends at the link's bandwidth.
struct LinkSpeed {
  double bytes_per_s = 0, latency_s = 0;
  double seconds(int64_t sent_bytes, int64_t steps) const {
    return static_cast<double>(steps) * latency_s + static_cast<double>(sent_bytes) / bytes_per_s;
  }
};

// A forward matmul, or one of the two its backward runs (the input's gradient, the weight's).
enum class MatmulPass { Forward, InputGrad, WeightGrad };

class Hardware {
 public:
  virtual ~Hardware() = default;
  // Seconds of `mm` in `dtype` (float8: the float8 rate), as the compute stream runs it.
  virtual double matmul_seconds(const Matmul& mm, c10::ScalarType dtype, MatmulPass pass) = 0;
  // Seconds of one attention call's forward, or of its backward.
  virtual double attention_seconds(const Attention& a, c10::ScalarType dtype, bool backward) = 0;
  // What one kernel costs besides its bytes: its launch, and in backward its autograd node too.
  double kernel_seconds(bool backward) const { return backward ? backward_kernel_s : forward_kernel_s; }
  // The dense rate per rank in `dtype` that MFU is against: the datasheet's (a cluster file), or the
  // best of a 1024^3 matmul (probed, as fsdpx-train's MFU probe measures it).
  virtual double peak_flops(c10::ScalarType dtype) = 0;
  // Seconds of a memory-bound op that reads and writes `bytes` on the compute stream.
  double memory_seconds(int64_t bytes) const { return static_cast<double>(bytes) / memory_bytes_per_s; }

  std::string what;  // one line: where the figures come from
  LinkSpeed node, network;  // collectives within a node, and across nodes (per rank)
  double memory_bytes_per_s = 0;
  double forward_kernel_s = 0, backward_kernel_s = 0;
  double host_bytes_per_s = 0;  // copies between the device and host memory (0: the device is the host)
  // The optimizer's step per shard element where it was timed here (the CPU); 0: from its bytes
  // at memory bandwidth.
  double optimizer_seconds_per_element = 0;
  bool float8 = false;  // whether matmul_seconds knows a float8 rate
  int accelerators_per_node = 0;  // a cluster file's (0: this machine)
  int64_t memory_per_accelerator = 0;  // bytes, a cluster file's (0: this machine)
};

// This machine's CPU with `threads` intra-op threads for each of `ranks` ranks: matmuls timed at
// their shapes (or a slice of one where the whole would take long), memory bandwidth by an
// elementwise add, each run by as many ranks' threads at once as the cores hold (at most `ranks`),
// so that the caches and memory are shared as the ranks share them in training; and Gloo's
// all-gather between two ranks of this machine. Ranks beyond the cores share them: step_costs.h scales for that. Every
// figure is cached under FSDPX_CACHE_DIR (else $XDG_CACHE_HOME/fsdpx, else ~/.cache/fsdpx) in probes.json, keyed by the
// CPU, the threads and ATen's kernels, so that a later plan on this machine takes none of the probes' time.
std::unique_ptr<Hardware> probe_this_machine(int threads, int ranks);

// Seconds per shard element of `opt`'s step over a shard of `storage` with gradients of `gradient`,
// timed here with `threads` threads: the median of a few steps over a million elements. `opt` may
// be one a probe stepped already: it is initialised anew.
double optimizer_seconds_per_element(Optimizer& opt, c10::ScalarType storage, c10::ScalarType gradient, int threads);

// The accelerators of a cluster file (docs/planning.md says its fields). Throws fsdpx::Error naming
// the file and what is missing or wrong.
std::unique_ptr<Hardware> read_cluster_file(const std::string& path);

}  // namespace fsdpx
