// MemoryReport: the bytes a sharded module (ShardingEngine, fsdpx::ShardedModule) holds right now.
#pragma once

#include <cstdint>

namespace fsdpx {

struct MemoryReport {
  int64_t param_bytes = 0;      // sharded parameters (padded)
  int64_t grad_bytes = 0;       // sharded gradients (padded)
  int64_t unsharded_bytes = 0;  // gathered parameters allocated right now
  // The post-forward parts units of a post-forward group hold from forward to backward, right now
  int64_t post_forward_bytes = 0;
};

}  // namespace fsdpx
