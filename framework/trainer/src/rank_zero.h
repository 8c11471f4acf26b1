// Work only rank 0 does (the run directory, metrics.jsonl, summary.json, pruning checkpoints),
// with its outcome agreed by every rank.
#pragma once

#include <functional>
#include <string>

#include "fsdpx/framework/runtime/communicator.h"

namespace fsdpx {

// Runs `work` on rank 0 of `world`, then every rank learns how it went (one broadcast; a second
// carries the message after a failure). If it threw, every rank throws fsdpx::Error with rank 0's
// message at once, instead of waiting for rank 0 in the next collective until its timeout.
// Collective: every rank calls it.
void on_rank_zero(Communicator& world, const std::function<void()>& work);

// A verdict every rank reaches together: when any rank's `refusal` is not empty, every rank throws
// fsdpx::Error with the lowest such rank's (naming it when `world` has several ranks); otherwise
// none throws. One all-gather; a broadcast carries the message after a refusal. Collective.
void refuse_together(Communicator& world, const std::string& refusal);

}  // namespace fsdpx
