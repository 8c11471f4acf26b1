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

bool reshards_after_forward(const ShardingLayout& layout, bool root, std::optional<bool> unit_choice) {
  return layout.shard_group_size > 1 && !root && unit_choice.value_or(layout.reshard_after_forward);
}

}  // namespace fsdpx
