// How the ranks of a save or load agree: every rank fails when one does, and digests are summed over them.
#include "rank_agreement.h"

#include <cstdint>
#include <exception>

#include "fsdpx/error.h"

namespace fsdpx::ckpt {

// Runs `local` on this rank, then agrees over all ranks: if any rank failed, every rank throws
// (the failing rank with its own message), so that no rank waits for a peer that gave up.
void agree(const CheckpointContext& ctx, const std::string& what, const std::function<void()>& local,
           std::vector<RowDigest>* digests) {
  std::string error;
  try {
    local();
  } catch (const std::exception& e) {
    error = e.what();
  }
  // One all-sum carries every rank's failure flag and, on load, the digests' partial sums.
  std::vector<int64_t> sums(static_cast<size_t>(ctx.world_size), 0);
  sums[static_cast<size_t>(ctx.rank)] = error.empty() ? 0 : 1;
  if (digests)
    for (const auto& d : *digests) {
      sums.push_back(d.lo);
      sums.push_back(d.hi);
    }
  if (ctx.all_sum) ctx.all_sum(sums);
  if (!error.empty()) throw Error(error);
  for (int r = 0; r < ctx.world_size; ++r)
    if (sums[static_cast<size_t>(r)])
      throw Error(what + " failed on rank " + std::to_string(r) + " (its log says why)");
  if (digests)
    for (size_t i = 0; i < digests->size(); ++i) {
      const size_t at = static_cast<size_t>(ctx.world_size) + 2 * i;
      (*digests)[i].lo = sums[at];  // the kind stays the one the load chose
      (*digests)[i].hi = sums[at + 1];
    }
}

// After a load: every tensor's digest, summed over the ranks, against the one the checkpoint
// recorded (`recorded` gives it, "" when it has none).
void check_digests(const std::string& dir, const CheckpointState& st, const std::vector<RowDigest>& digests,
                   const std::function<std::string(const std::string&)>& recorded, const char* source,
                   const char* damage) {
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    const std::string& name = st.tensors[i].name;
    const std::string want = recorded(name);
    if (want.empty()) continue;
    const std::string got = digests[i].hex();
    if (got != want)
      throw Error("checkpoint " + dir + ": tensor '" + name + "' does not match its digest (" + got + ", " + source +
                  " says " + want + "): " + damage);
  }
}

}  // namespace fsdpx::ckpt
