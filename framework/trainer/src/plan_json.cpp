#include "plan_json.h"

#include "format.h"
#include "fsdpx/framework/runtime/process_groups.h"  // device_spec

using json = nlohmann::json;

namespace fsdpx {

namespace {

// The predicted step in seconds per phase (StepClock's names), or why there is none.
json time_json(const RunPlan& p) {
  if (!p.time.predicted()) return {{"predicted", false}, {"why", p.time_not_predicted}};
  const StepTime& t = p.time;
  return {{"predicted", true},
          {"hardware", p.time_hardware},
          {"step_s", t.step},
          {"phases_s",
           {{"forward", t.forward},
            {"backward", t.backward},
            {"all_gather_wait", t.all_gather_wait},
            {"reduce_scatter_wait", t.reduce_scatter_wait},
            {"optimizer", t.optimizer},
            {"other", t.other}}},
          {"recompute_s", t.recompute},
          {"matmul_s", t.matmul},
          {"memory_bound_s", t.memory},
          {"copies_s", t.copies},
          {"communication_s", t.communication},
          {"exposed_communication_s", t.all_gather_wait + t.reduce_scatter_wait},
          {"tokens_per_s", p.tokens_per_second()},
          {"mfu", p.mfu()},
          {"peak_flops_per_rank", p.peak_flops},
          {"bound", t.bound}};
}

}  // namespace

json plan_json(const RunPlan& p) {
  json units = json::array();
  for (const auto& u : p.units)
    units.push_back({{"unit", u.fqn},
                     {"params", u.params},
                     {"shard_numel", u.shard_numel},
                     {"gathered_bytes", u.unsharded_bytes},
                     {"reshard_after_forward", u.reshard_after_forward},
                     {"recompute", u.recompute},
                     {"compute", dtype_name(u.dtypes.compute)},
                     {"reduce", dtype_name(u.dtypes.reduce)},
                     {"float8", u.float8},
                     {"gather_bytes", u.gather_bytes},
                     {"float8_gathered_numel", u.float8_numel}});
  json savings = json::object();
  for (const auto& [option, bytes] : p.option_savings) savings[option] = bytes;
  return {{"world_size", p.topology.world_size},
          {"shard_group_size", p.layout.shard_group_size},
          {"replicate_group_size", p.layout.replicate_group_size},
          {"total_params", p.total_params},
          {"param_bytes", p.param_bytes},
          {"grad_bytes", p.grad_bytes},
          {"optimizer_bytes", p.optimizer_bytes},
          {"peak_unit", p.peak_unit},
          {"peak_unit_bytes", p.peak_unit_bytes},
          {"allgather_bytes", p.allgather_bytes},
          {"reduce_scatter_bytes", p.reduce_scatter_bytes},
          {"all_reduce_bytes", p.all_reduce_bytes},
          {"all_to_all_bytes", p.all_to_all_bytes},
          {"sent_bytes", p.sent_bytes},
          {"float8_all_gather", p.float8_all_gather},
          {"dtypes",
           {{"storage", dtype_name(p.dtypes.storage)},
            {"compute", dtype_name(p.dtypes.compute)},
            {"reduce", dtype_name(p.dtypes.reduce)},
            {"gradient", dtype_name(p.dtypes.gradient)}}},
          {"units", units},
          {"threads_per_rank", p.threads.threads},
          {"memory",
           {{"peak_bytes", p.memory.peak},
            {"peak_where", p.memory.peak_where},
            {"forward_peak_bytes", p.memory.forward_peak},
            {"backward_peak_bytes", p.memory.backward_peak},
            {"optimizer_peak_bytes", p.memory.optimizer_peak},
            {"device", device_spec(p.device)},
            {"host_bytes", p.memory.host_bytes},
            {"activation_host_bytes", p.memory.activation_host_bytes},
            {"resident_peak_bytes", p.resident_peak},
            {"process_bytes", p.process_bytes},
            {"activation_bytes", p.activations_stated ? p.memory.activation_bytes : -1}}},
          {"deterministic", p.deterministic},
          {"optimizer_in_backward", p.optimizer_in_backward},
          {"option_savings", savings},
          {"warnings", p.warnings},
          {"not_applied", p.not_applied},
          {"checkpoint_pool_bytes", p.checkpoint_pool_bytes},
          {"time", time_json(p)}};
}

}  // namespace fsdpx
