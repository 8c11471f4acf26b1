// What every part of one engine reads and never changes after construction.
#pragma once

#include "fsdpx/framework/engine/sharding_engine.h"

namespace fsdpx {

struct EngineConfig {
  EngineComms comms;
  EngineOptions options;
  int64_t shard_size = 1;  // ranks in the shard group
  int shard_rank = 0;      // this rank's index in it
};

}  // namespace fsdpx
