// "These numbers from every rank": one all-gather of a few values per rank, unpacked by rank.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdpx/export.h"
#include "fsdpx/framework/runtime/communicator.h"

namespace fsdpx {

// Every rank's `mine`, in rank order: element r is rank r's. `mine` has the same length on every
// rank. One all-gather over `group` (in fp64, or int64). Collective.
FSDPX_API std::vector<std::vector<double>> from_every_rank(Communicator& group, const std::vector<double>& mine);
FSDPX_API std::vector<std::vector<int64_t>> from_every_rank(Communicator& group, const std::vector<int64_t>& mine);

}  // namespace fsdpx
