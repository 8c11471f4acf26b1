// How the ranks of a save or load agree: every rank fails when one does, and digests are summed over them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/framework/checkpoint/row_digest.h"

namespace fsdpx::ckpt {

// Runs `local` on this rank, then agrees over all ranks: if any rank failed, every rank throws
// (the failing rank with its own message), so that no rank waits for a peer that gave up. With
// `digests`, their partial sums ride the same all-sum and come back summed over the ranks.
void agree(const CheckpointContext& ctx, const std::string& what, const std::function<void()>& local,
           std::vector<RowDigest>* digests = nullptr);

// After a load: every tensor's digest, summed over the ranks, against the one the checkpoint
// recorded (`recorded` gives it, "" when it has none).
void check_digests(const std::string& dir, const CheckpointState& st, const std::vector<RowDigest>& digests,
                   const std::function<std::string(const std::string&)>& recorded, const char* source,
                   const char* damage);

}  // namespace fsdpx::ckpt
