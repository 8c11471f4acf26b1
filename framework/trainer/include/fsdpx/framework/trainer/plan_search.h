// The search over compositions (fsdpx-train --plan-search): every way of running a configuration's
// model, data and samples per step that the configuration leaves open, planned as --dry-run plans
// it (memory and time), kept where it fits, and ranked by predicted tokens per second.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdpx/export.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/trainer/run_plan.h"
#include "fsdpx/topology.h"

namespace fsdpx {

// One open choice of a run and the values the search tries for it, each as the command line
// spells it. A dimension the configuration gives (on the command line or in --config's file)
// is not searched: `fixed` says by what.
struct SearchDimension {
  std::string name;  // "sharding", "units", "--optimizer-in-backward", "precision", "micro-batch"
  std::vector<std::pair<std::string, std::vector<std::string>>> choices;  // label, flags
  std::string fixed;
};

struct SearchedPlan {
  std::vector<std::string> flags;  // what this composition adds to the configuration's command line
  std::string label;  // one line: each dimension's choice
  RunPlan plan;
};

struct FSDPX_API PlanSearch {
  std::string program = "fsdpx-train";  // what the command lines start with (and the launcher's flag)
  std::vector<std::string> base_args;  // the configuration's command line, less what the search sets
  std::vector<SearchDimension> dimensions;
  std::vector<SearchedPlan> fitting;  // fastest first
  int64_t compositions = 0;  // the product of the dimensions' choices
  int64_t planned = 0, too_big = 0, refused = 0;
  // Not planned: compositions that hold more than one that did not fit (a larger micro-batch of
  // a composition whose smaller one does not fit).
  int64_t pruned = 0;
  std::vector<std::string> refusals;  // the plan's reasons, each once
  SearchedPlan smallest_too_big;  // of those that do not fit, the one with the smallest peak
  int64_t memory_limit = 0;  // bytes per rank a composition must fit in (0: this machine's check)
  std::string limit_source;
  double seconds = 0;
  // The table of the `top` fastest, and their command lines.
  std::string text(size_t top) const;
  // Every fitting composition, fastest first, with its arguments (base_args and its flags) and its
  // predicted step, tokens/s, MFU, peak and bound; and the counts (search.json under --out).
  std::string json() const;
};

// Searches the compositions `args` (fsdpx-train's command line, --plan-search among it) leaves
// open for `topology` (request: fsdpx-train's, train_command.h). The configuration as given is
// planned first: a bad option is refused as --dry-run refuses it, and a plan without a predicted
// time (a GPU run without --cluster) is refused, since the search ranks by it.
FSDPX_API PlanSearch search_plans(const PluginHost& host, const std::vector<std::string>& args,
                                  const ConfigRequest& request, const Topology& topology);

}  // namespace fsdpx
