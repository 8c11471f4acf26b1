// The one header of fsdpx as a library: fsdpx::Runtime, fsdpx::fully_shard and ShardedModule
// (fsdpx/framework/trainer/fully_shard.h), and FSDPX_MODULE for the layers that become units
// (fsdpx/unit.h). docs/library.md says how to use them.
#pragma once

#include "fsdpx/fully_shard.h"
#include "fsdpx/unit.h"
