#include "step_costs.h"

#include <algorithm>

#include "fsdpx/framework/engine/unit_buffers.h"
#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "fsdpx/framework/runtime/cpu_resources.h"
#include "fsdpx/layer_work.h"

namespace fsdpx {
namespace {

// Where the ranks' threads outnumber the cores, each rank computes, and sends through Gloo, in that
// fraction of the time: the probes ran on cores of their own.
double oversubscription(const RunPlan& plan) {
  if (plan.device != DeviceKind::Cpu) return 1;
  return std::max(1.0, static_cast<double>(plan.threads.threads) * plan.topology.local_world_size / affinity_cpus());
}

std::vector<LayerCost> stated_layers(const RunPlan& plan, const LayerWork& work, Hardware& hw, int64_t batch,
                                     int64_t seq) {
  std::vector<LayerCost> out;
  for (const LayerOps& ops : work.layer_ops(batch, seq, plan.dtypes.compute)) {
    const UnitBytes& unit = plan.units[innermost_unit(plan.units, ops.path)];
    const c10::ScalarType dtype = unit.float8 && hw.float8 ? at::kFloat8_e4m3fn : unit.dtypes.compute;
    LayerCost c;
    c.path = ops.path;
    for (const Matmul& mm : ops.matmuls) {
      c.forward_matmul += hw.matmul_seconds(mm, dtype, MatmulPass::Forward);
      c.backward_matmul +=
          hw.matmul_seconds(mm, dtype, MatmulPass::InputGrad) + hw.matmul_seconds(mm, dtype, MatmulPass::WeightGrad);
    }
    for (const Attention& a : ops.attention) {
      c.forward_matmul += hw.attention_seconds(a, unit.dtypes.compute, false);
      c.backward_matmul += hw.attention_seconds(a, unit.dtypes.compute, true);
    }
    c.forward_memory = hw.memory_seconds(ops.memory_bytes) + ops.kernels * hw.kernel_seconds(false);
    c.backward_memory = hw.memory_seconds(ops.backward_memory_bytes) + ops.backward_kernels * hw.kernel_seconds(true);
    out.push_back(c);
  }
  return out;
}

// Without LayerWork: the model's training flops per token, shared by the units' parameters, at
// the rate of a square matmul; a third in forward, two in backward.
std::vector<LayerCost> shared_layers(const RunPlan& plan, const Model& model, Hardware& hw, int64_t tokens) {
  std::vector<LayerCost> out;
  const Matmul square{1024, 1024, 1024};
  const double flops = model.flops_per_token() * static_cast<double>(tokens);
  for (const UnitBytes& u : plan.units) {
    const double share = plan.total_params > 0 ? static_cast<double>(u.params) / plan.total_params : 0;
    const double seconds =
        flops * share * hw.matmul_seconds(square, u.dtypes.compute, MatmulPass::Forward) / square.flops();
    LayerCost c;
    c.path = u.fqn;
    c.forward_matmul = seconds / 3;
    c.backward_matmul = 2 * seconds / 3;
    out.push_back(c);
  }
  return out;
}

// A group of `ranks` consecutive ranks crosses nodes where it holds more than a node's ranks.
const LinkSpeed& link_for(const RunPlan& plan, const Hardware& hw, bool crosses) {
  return crosses && plan.topology.num_nodes > 1 ? hw.network : hw.node;
}

UnitCost unit_cost(const RunPlan& plan, const UnitBytes& b, Hardware& hw, double optimizer_bytes_per_element) {
  const int64_t S = plan.layout.shard_group_size, R = plan.layout.replicate_group_size;
  const int64_t local = std::max(1, plan.topology.local_world_size);
  const LinkSpeed& shard_link = link_for(plan, hw, S > local);
  const LinkSpeed& replica_link = link_for(plan, hw, true);
  const bool offload = plan.layout.offloads(plan.device == DeviceKind::Cpu);
  UnitCost c;
  const int64_t reduce_payload = S * b.shard_numel * element_bytes(b.dtypes.reduce);
  if (S > 1) {
    c.gather = shard_link.seconds(ring_sent_bytes(Collective::AllGather, b.gather_bytes, S), S - 1);
    c.pack = hw.memory_seconds(2 * reduce_payload);
    // Gloo reduce-scatters by an all-to-all and a sum of the slices received (CPU, sim); NCCL
    // in its ring.
    const bool gloo = plan.device != DeviceKind::Cuda;
    c.reduce = shard_link.seconds(
        ring_sent_bytes(gloo ? Collective::AllToAll : Collective::ReduceScatter, reduce_payload, S), S - 1);
    if (gloo) c.reduce += hw.memory_seconds(reduce_payload + b.shard_numel * element_bytes(b.dtypes.reduce));
  }
  if (plan.deterministic) {  // per sample: every world rank's rows of each shard, one all-to-all
    const int64_t W = plan.topology.world_size;
    const int64_t exchange = W * b.shard_numel * element_bytes(b.dtypes.reduce);
    c.reduce = link_for(plan, hw, W > local).seconds(ring_sent_bytes(Collective::AllToAll, exchange, W), W - 1) +
               hw.memory_seconds(exchange);
  }
  c.copy_out = hw.memory_seconds(2 * b.unsharded_bytes);
  if (R > 1 && !plan.deterministic) {
    const int64_t bytes = b.shard_numel * element_bytes(b.dtypes.gradient);
    (S > 1 ? c.replicate : c.reduce) =
        replica_link.seconds(ring_sent_bytes(Collective::AllReduce, bytes, R), 2 * (R - 1));
  }
  if (offload && hw.host_bytes_per_s > 0) {  // the shard comes to the device, its gradient goes back
    c.gather += static_cast<double>(b.shard_numel * element_bytes(b.dtypes.storage)) / hw.host_bytes_per_s;
    c.reduce += static_cast<double>(b.shard_numel * element_bytes(b.dtypes.gradient)) / hw.host_bytes_per_s;
  }
  const double n = static_cast<double>(b.shard_numel);
  if (hw.optimizer_seconds_per_element > 0 && (offload || plan.device == DeviceKind::Cpu))
    c.optimizer = n * hw.optimizer_seconds_per_element;
  else  // each element's parameter read and written, its gradient read, its state read and written
    c.optimizer = hw.memory_seconds(
        static_cast<int64_t>(n * (2.0 * element_bytes(b.dtypes.storage) + element_bytes(b.dtypes.gradient) +
                                  2.0 * std::max(0.0, optimizer_bytes_per_element))));
  const double shared = oversubscription(plan);
  for (double* f : {&c.gather, &c.copy_out, &c.pack, &c.reduce, &c.replicate, &c.optimizer}) *f *= shared;
  return c;
}

}  // namespace

std::unique_ptr<Hardware> planning_hardware(const TrainSettings& s, const RunPlan& plan, std::string& why) {
  if (!s.cluster.empty()) return read_cluster_file(s.cluster);
  if (plan.device == DeviceKind::Cpu)
    return probe_this_machine(plan.threads.threads, std::min(plan.topology.local_world_size,
                                                             std::max(1, affinity_cpus() / plan.threads.threads)));
  why = std::string("the run computes on ") + device_spec(plan.device) +
        ", and the time model probes only the CPU it plans on: give --cluster FILE (configs/clusters/) to predict it";
  return nullptr;
}

StepCosts step_costs(const RunPlan& plan, const Model& model, Hardware& hw, int64_t batch,
                     double optimizer_bytes_per_element) {
  StepCosts costs;
  const int64_t seq =
      plan.samples_per_step > 0 ? std::max<int64_t>(1, plan.tokens_per_step / plan.samples_per_step) : 1;
  if (const auto* work = dynamic_cast<const LayerWork*>(&model))
    costs.layers = stated_layers(plan, *work, hw, batch, seq);
  else costs.layers = shared_layers(plan, model, hw, batch * seq);
  const double shared = oversubscription(plan);
  for (LayerCost& c : costs.layers)
    for (double* f : {&c.forward_matmul, &c.forward_memory, &c.backward_matmul, &c.backward_memory}) *f *= shared;
  int64_t grad_bytes = 0;
  for (const UnitBytes& b : plan.units) {
    costs.units.push_back(unit_cost(plan, b, hw, optimizer_bytes_per_element));
    grad_bytes += b.shard_numel * element_bytes(b.dtypes.gradient);
  }
  const int64_t S = plan.layout.shard_group_size;
  costs.communication_on_compute_cores =
      plan.device == DeviceKind::Cpu &&
      static_cast<int64_t>(plan.threads.threads) * plan.topology.local_world_size >= affinity_cpus();
  costs.clip = hw.memory_seconds(grad_bytes) + (S > 1 ? hw.node.seconds(16, 2 * (S - 1)) : 0);
  return costs;
}

}  // namespace fsdpx
