// ReshardAfterForward: FSDP2's reshard_after_forward (bool or int) for one unit.
#pragma once

namespace fsdpx {

// One unit's reshard_after_forward, as FSDP2's fully_shard takes it. true frees the unit's gathered
// parameters after its forward and all-gathers them again for its backward; false keeps them from
// forward to backward (one all-gather fewer per step, their bytes held meanwhile); an int k that
// divides the shard group's size S keeps 1/k of them on each rank (S/k ranks' shards) and
// all-gathers them for backward within each run of k consecutive ranks (EngineComms::
// post_forward): k = S is true, k = 1 is false, and between, a smaller all-gather (within a node,
// say) for S/k times the shard's bytes held from forward to backward.
struct ReshardAfterForward {
  ReshardAfterForward() = default;
  ReshardAfterForward(bool r) : reshard(r) {}  // NOLINT(google-explicit-constructor): FSDP2's bool
  ReshardAfterForward(int k) : group(k), is_int(true) {}  // NOLINT(google-explicit-constructor): FSDP2's int
  bool reshard = true;
  int group = 0;  // the post-forward group's k (the engine refuses k < 1 and k not dividing S)
  bool is_int = false;  // a post-forward group (FSDP2's int), not a bool
};

}  // namespace fsdpx
