#include "engine_comms.h"

#include "unit_selection.h"

#include <memory>
#include <set>
#include <vector>

namespace fsdpx {

Batch on_device(Batch b, const c10::Device& device) {
  if (device.is_cpu()) return b;
  b.inputs = b.inputs.to(device, /*non_blocking=*/true);  // from pinned memory where the source pinned it
  b.targets = b.targets.to(device, /*non_blocking=*/true);
  return b;
}

EngineComms engine_comms(ProcessGroups& groups, const EngineOptions& options, CommCounters& counters) {
  const ShardingLayout& layout = options.layout;
  const bool deterministic = options.deterministic;
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
  // Every rank has the same choices (the engine compares them), so every rank makes the same
  // groups in the same order (by k); a k that does not divide S is the engine's error to give.
  std::set<int> ks;
  for (const auto& [unit, choice] : options.reshard_after_forward_by_unit)
    if (choice.is_int && choice.group > 1 && choice.group < S && S % choice.group == 0) ks.insert(choice.group);
  const int rank = groups.topology().rank;
  for (int k : ks) {
    std::vector<int> ranks;  // shard groups are runs of S consecutive ranks, so these are within one
    for (int r = rank - rank % k; r < rank - rank % k + k; ++r) ranks.push_back(r);
    comms.post_forward[k] = counted(groups.new_group("post_forward", ranks));
  }
  return comms;
}

std::unique_ptr<ShardingEngine> build_engine(std::shared_ptr<Model> model, const WrapPolicy& wrap,
                                             const TrainSettings& s, ProcessGroups& groups, EngineOptions options,
                                             CommCounters& counters) {
  const EngineComms comms = engine_comms(groups, options, counters);
  std::vector<UnitSelection> units = select_units(*model, wrap, s);
  return std::make_unique<ShardingEngine>(std::move(model), units, comms, std::move(options));
}

}  // namespace fsdpx
