#include "engine_comms.h"

#include "unit_selection.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fsdpx/error.h"
#include "fsdpx/framework/engine/unit_buffers.h"
#include "fsdpx/framework/runtime/every_rank.h"
#include "fsdpx/suggest.h"

namespace fsdpx {
namespace {

// "groups of 2, 4" or "no group" (0s are padding).
std::string groups_text(const std::vector<int64_t>& ks) {
  std::vector<std::string> sizes;
  for (int64_t k : ks)
    if (k > 0) sizes.push_back(std::to_string(k));
  return sizes.empty() ? "no group" : "groups of " + join_names(sizes);
}

// Every rank must make the same groups of k, in the same order, before the engine compares the
// rest of its choices: a rank making a group that its peers do not make would wait in that group's
// rendezvous until it timed out. Two all-gathers over the control group: how many groups, then
// which. Collective.
void check_same_post_forward_groups(Communicator& control, const std::set<int>& ks) {
  if (control.size() <= 1) return;
  int64_t most = 0;
  for (const auto& n : from_every_rank(control, std::vector<int64_t>{static_cast<int64_t>(ks.size())}))
    most = std::max(most, n[0]);
  if (most == 0) return;
  std::vector<int64_t> mine(ks.begin(), ks.end());
  mine.resize(static_cast<size_t>(most), 0);
  const auto all = from_every_rank(control, mine);
  std::map<std::vector<int64_t>, std::vector<std::string>> ranks_by_sizes;
  for (size_t r = 0; r < all.size(); ++r) ranks_by_sizes[all[r]].push_back(std::to_string(r));
  if (ranks_by_sizes.size() == 1) return;
  std::string which;
  for (const auto& [sizes, ranks] : ranks_by_sizes)
    which += (which.empty() ? "" : "; ") + groups_text(sizes) + " on rank(s) " + join_names(ranks);
  throw Error("reshard_after_forward differs between ranks: post-forward groups: " + which +
              "; every rank must give each unit the same reshard_after_forward");
}

}  // namespace

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
  // Every rank makes the same groups in the same order (by k), checked before any is made; the
  // engine compares the rest of the choices, and a k that does not divide S is its error to give.
  std::set<int> ks;
  for (const auto& [unit, choice] : options.reshard_after_forward_by_unit)
    if (choice.is_int && keeps_post_forward_part(choice.group, S)) ks.insert(choice.group);
  check_same_post_forward_groups(*groups.control(), ks);
  const int rank = groups.topology().rank;
  for (int k : ks) {
    std::vector<int> ranks;  // shard groups are runs of S consecutive ranks, so these are within one
    for (int r = rank - rank % k; r < rank - rank % k + k; ++r) ranks.push_back(r);
    comms.post_forward[k] = counted(groups.new_group("post_forward", ranks));
  }
  return comms;
}

std::unique_ptr<ShardingEngine> build_engine(std::shared_ptr<Model> model, const WrapPolicy& wrap,
                                             const LayerTypeChoices& s, ProcessGroups& groups, EngineOptions options,
                                             CommCounters& counters) {
  const EngineComms comms = engine_comms(groups, options, counters);
  std::vector<UnitSelection> units = select_units(*model, wrap, s);
  for (const std::string& unit : offloaded_units(*model, units, s)) options.activation_offload_units.insert(unit);
  return std::make_unique<ShardingEngine>(std::move(model), units, comms, std::move(options));
}

}  // namespace fsdpx
