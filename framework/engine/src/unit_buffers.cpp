#include "fsdpx/framework/engine/unit_buffers.h"

namespace fsdpx {

bool gathers_into_own_storage(int64_t shard_size, const PrecisionSpec& dtypes) {
  return shard_size > 1 || dtypes.compute != dtypes.storage;
}

int64_t all_gather_bytes(int64_t shard_numel, int64_t shard_size, const PrecisionSpec& dtypes) {
  return shard_size > 1 ? shard_size * shard_numel * static_cast<int64_t>(c10::elementSize(dtypes.compute)) : 0;
}

int64_t gathered_bytes(int64_t shard_numel, int64_t shard_size, const PrecisionSpec& dtypes) {
  if (!gathers_into_own_storage(shard_size, dtypes)) return 0;
  return shard_size * shard_numel * static_cast<int64_t>(c10::elementSize(dtypes.compute));
}

int post_forward_group(const ShardingLayout& layout, bool root, std::optional<ReshardAfterForward> unit_choice) {
  const int S = layout.shard_group_size;
  if (S <= 1 || root) return 1;
  if (!unit_choice) return layout.reshard_after_forward ? S : 1;
  if (unit_choice->is_int) return unit_choice->group;
  return unit_choice->reshard ? S : 1;
}

bool keeps_post_forward_part(int k, int shard_size) {
  return k > 1 && k < shard_size && shard_size % k == 0;
}

bool reshards_after_forward(const ShardingLayout& layout, bool root, std::optional<ReshardAfterForward> unit_choice,
                            bool own_storage) {
  if (post_forward_group(layout, root, unit_choice) > 1) return true;
  if (layout.shard_group_size != 1 || root || !own_storage) return false;
  return unit_choice ? !unit_choice->is_int && unit_choice->reshard : layout.reshard_after_forward;
}

}  // namespace fsdpx
