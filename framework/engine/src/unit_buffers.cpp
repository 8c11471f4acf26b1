#include "fsdpx/framework/engine/unit_buffers.h"

#include "fsdpx/error.h"
#include "fsdpx/float8.h"

namespace fsdpx {

bool gathers_into_own_storage(int64_t shard_size, const PrecisionSpec& dtypes, bool offloads) {
  return offloads || shard_size > 1 || dtypes.compute != dtypes.storage;
}

namespace {
// One rank's row of the all-gather: the compute dtype's elements, then float8's bytes.
int64_t row_bytes(int64_t shard_numel, const PrecisionSpec& dtypes, int64_t float8_numel) {
  return (shard_numel - float8_numel) * static_cast<int64_t>(c10::elementSize(dtypes.compute)) + float8_numel;
}
}  // namespace

int64_t all_gather_bytes(int64_t shard_numel, int64_t shard_size, const PrecisionSpec& dtypes, int64_t float8_numel) {
  return shard_size > 1 ? shard_size * row_bytes(shard_numel, dtypes, float8_numel) : 0;
}

int64_t gathered_bytes(int64_t shard_numel, int64_t shard_size, const PrecisionSpec& dtypes, int64_t float8_numel,
                       bool offloads) {
  if (!gathers_into_own_storage(shard_size, dtypes, offloads)) return 0;
  return shard_size * row_bytes(shard_numel, dtypes, float8_numel);
}

bool gathers_in_float8(bool linear_weight, const std::vector<int64_t>& shape) {
  return linear_weight && float8_eligible_shape(shape);
}

void check_float8_all_gather(int shard_size, bool model_lists_weights, int64_t float8_params) {
  const std::string what = "float8 all-gather (--precision.float8_all_gather true) ";
  if (shard_size <= 1)
    throw Error(what +
                "casts each shard to float8 before its all-gather, and this layout's shard group is one rank, "
                "which gathers nothing: use full_shard, shard_grad_op or hybrid_shard with a shard size above "
                "1, or float8_all_gather false");
  if (!model_lists_weights)
    throw Error(what +
                "needs a model that lists the parameters only fsdpx::linear reads (fsdpx::LinearWeights, "
                "fsdpx/capabilities.h), and this one does not (gpt does): use float8_all_gather false");
  if (float8_params == 0)
    throw Error(what +
                "found no parameter to gather in float8: none of the float8 units' linear weights has two "
                "sizes that are multiples of 16; use float8_all_gather false");
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
