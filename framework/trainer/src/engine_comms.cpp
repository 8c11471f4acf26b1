#include "engine_comms.h"

#include "unit_selection.h"

#include <memory>

namespace fsdpx {

Batch on_device(Batch b, const c10::Device& device) {
  if (device.is_cpu()) return b;
  b.inputs = b.inputs.to(device, /*non_blocking=*/true);  // from pinned memory where the source pinned it
  b.targets = b.targets.to(device, /*non_blocking=*/true);
  return b;
}

EngineComms engine_comms(ProcessGroups& groups, const ShardingLayout& layout, bool deterministic,
                         CommCounters& counters) {
  EngineComms comms;
  comms.world = groups.world();
  comms.control = groups.control();
  const int S = layout.shard_group_size, R = layout.replicate_group_size;
  auto counted = [&](std::shared_ptr<Communicator> c) {
    auto wrapped = std::make_shared<CountingCommunicator>(std::move(c));
    counters.add(wrapped);
    return wrapped;
  };
  if (S > 1 && R > 1) {
    auto h = groups.hybrid(S);
    comms.shard = counted(h.shard);
    comms.replicate = counted(h.replicate);
  } else if (S > 1) {
    comms.shard = counted(groups.world());
  } else if (R > 1) {
    comms.replicate = counted(groups.world());
  }
  if (deterministic) comms.world = counted(groups.world());  // it carries the gradients then
  return comms;
}

std::unique_ptr<ShardingEngine> build_engine(std::shared_ptr<Model> model, const WrapPolicy& wrap,
                                             const TrainSettings& s, ProcessGroups& groups, EngineOptions options,
                                             CommCounters& counters) {
  const EngineComms comms = engine_comms(groups, options.layout, options.deterministic, counters);
  std::vector<UnitSelection> units = select_units(*model, wrap, s);
  return std::make_unique<ShardingEngine>(std::move(model), units, comms, std::move(options));
}

}  // namespace fsdpx
