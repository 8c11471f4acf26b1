#include "fsdpx/framework/runtime/topology_resolver.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "environment_values.h"
#include "fsdpx/error.h"

extern char** environ;

namespace fsdpx {
namespace {

// Both or neither; returns whether both are set.
bool pair(const Environment& env, const std::string& a, const std::string& b, const std::string& who) {
  bool ha = env_value(env, a).has_value(), hb = env_value(env, b).has_value();
  if (ha != hb)
    throw Error((ha ? a : b) + " is set but " + (ha ? b : a) + " is not; " + who + " sets both");
  return ha;
}

}  // namespace

Environment process_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

namespace {

// Which source decides rank and world size, and those two, checked.
void resolve_rank(const TopologyFlags& flags, const Environment& env, ResolvedTopology& r) {
  Topology& t = r.topology;
  // Each source's own consistency is checked only when that source decides.
  const bool by_flags = flags.rank || flags.world_size;
  const bool torchrun = !by_flags && pair(env, "RANK", "WORLD_SIZE", "torchrun");
  const bool slurm = !by_flags && !torchrun && env_value(env, "SLURM_PROCID").has_value();
  if (slurm && !env_value(env, "SLURM_NTASKS") && !env_value(env, "SLURM_NPROCS"))
    throw Error("SLURM_PROCID is set but SLURM_NTASKS is not; run the workers with srun");
  if (by_flags) {
    if (!flags.rank || !flags.world_size)
      throw Error(std::string(flags.rank ? "--rank" : "--world-size") + " is given but " +
                  (flags.rank ? "--world-size" : "--rank") + " is not; give both");
    t.rank = *flags.rank;
    t.world_size = *flags.world_size;
    r.source = "flags";
  } else if (torchrun) {
    t.rank = *env_int(env, "RANK");
    t.world_size = *env_int(env, "WORLD_SIZE");
    r.source = "torchrun";
  } else if (slurm) {
    t.rank = *env_int(env, "SLURM_PROCID");
    t.world_size = env_value(env, "SLURM_NTASKS") ? *env_int(env, "SLURM_NTASKS") : *env_int(env, "SLURM_NPROCS");
    r.source = "slurm";
  } else {
    r.source = "single process";
  }
  const std::string rank_names = r.source == "flags"      ? "--rank/--world-size"
                                 : r.source == "torchrun" ? "RANK/WORLD_SIZE"
                                 : r.source == "slurm"    ? "SLURM_PROCID/SLURM_NTASKS"
                                                          : "defaults";
  if (t.world_size < 1)
    throw Error("world size " + std::to_string(t.world_size) + " (" + rank_names + ") must be at least 1");
  if (t.rank < 0 || t.rank >= t.world_size)
    throw Error("rank " + std::to_string(t.rank) + " is outside world size " + std::to_string(t.world_size) + " (" +
                rank_names + "); ranks run 0.." + std::to_string(t.world_size - 1));
}

// Slurm's view of this node (its per-node fields describe Slurm's tasks only).
struct SlurmNode {
  std::optional<int> local, local_size, node, nodes;
  std::vector<std::string> hosts;  // the step's nodes, where the tasks (and rank 0) run
};

SlurmNode slurm_node(const Environment& env) {
  SlurmNode s;
  s.local = env_int(env, "SLURM_LOCALID");
  s.node = env_int(env, "SLURM_NODEID");
  s.nodes = env_int(env, "SLURM_NNODES");
  // The step's nodes; the job's when there is no step.
  std::optional<std::string> list;
  for (const char* v : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (!list) list = env_value(env, v);
  if (list) {
    s.hosts = expand_hostlist(*list);
    if (!s.nodes) s.nodes = static_cast<int>(s.hosts.size());
  }
  if (auto per = env_value(env, "SLURM_NTASKS_PER_NODE")) {
    s.local_size = static_cast<int>(parse_integer(*per, "SLURM_NTASKS_PER_NODE"));
  } else if (auto spec = env_value(env, "SLURM_TASKS_PER_NODE")) {
    auto counts = expand_tasks_per_node(*spec);
    const int node = s.node.value_or(0);
    if (node >= static_cast<int>(counts.size()))
      throw Error("SLURM_NODEID=" + std::to_string(node) + " but SLURM_TASKS_PER_NODE='" + *spec + "' describes only " +
                  std::to_string(counts.size()) + " nodes");
    s.local_size = counts[static_cast<size_t>(node)];
  }
  return s;
}

// Local rank, local world size, node rank and number of nodes: each from its flag, then
// torchrun's variable (when rank did not come from Slurm), then Slurm's, then a default.
void resolve_node(const TopologyFlags& flags, const Environment& env, const SlurmNode& slurm, ResolvedTopology& r) {
  Topology& t = r.topology;
  const bool use_torchrun = r.source != "slurm";
  auto pick = [&](const std::optional<int>& flag, const char* torch_var, const std::optional<int>& from_slurm,
                  int fallback, std::string& origin, const std::string& flag_name) {
    if (flag) {
      origin = flag_name;
      return *flag;
    }
    if (auto v = use_torchrun ? env_int(env, torch_var) : std::nullopt) {
      origin = torch_var;
      return *v;
    }
    if (from_slurm) {
      origin = "Slurm";
      return *from_slurm;
    }
    origin = "default";
    return fallback;
  };
  std::string lr_from, lws_from, node_from, nodes_from;
  t.local_world_size = pick(flags.local_world_size, "LOCAL_WORLD_SIZE", slurm.local_size, t.world_size, lws_from,
                            "--local-world-size");
  t.local_rank = pick(flags.local_rank, "LOCAL_RANK", slurm.local,
                      t.local_world_size > 0 ? t.rank % t.local_world_size : 0, lr_from, "--local-rank");
  if (t.local_world_size < 1 || t.local_world_size > t.world_size)
    throw Error("local world size " + std::to_string(t.local_world_size) + " (" + lws_from +
                ") must be between 1 and the world size " + std::to_string(t.world_size));
  if (t.local_rank >= t.local_world_size)
    throw Error("local rank " + std::to_string(t.local_rank) + " (" + lr_from +
                ") must be below the local world size " + std::to_string(t.local_world_size) + " (" + lws_from + ")");
  const int default_nodes = (t.world_size + t.local_world_size - 1) / t.local_world_size;
  t.num_nodes = pick(flags.num_nodes, "GROUP_WORLD_SIZE", slurm.nodes, default_nodes, nodes_from, "--num-nodes");
  t.node_rank = pick(flags.node_rank, "GROUP_RANK", slurm.node, t.rank / t.local_world_size, node_from, "--node-rank");
  if (t.num_nodes < 1 || t.node_rank >= t.num_nodes)
    throw Error("node rank " + std::to_string(t.node_rank) + " (" + node_from + ") must be below the number of nodes " +
                std::to_string(t.num_nodes) + " (" + nodes_from + ")");
}

// The rendezvous address: flags, then MASTER_ADDR/MASTER_PORT, then (Slurm) the first host of the
// step and a port derived from the job and step.
void resolve_master(const TopologyFlags& flags, const Environment& env, const SlurmNode& slurm, ResolvedTopology& r) {
  Topology& t = r.topology;
  if (flags.master_addr) {
    t.master_addr = *flags.master_addr;
  } else if (auto a = env_value(env, "MASTER_ADDR")) {
    t.master_addr = *a;
  } else if (r.source == "slurm" && !slurm.hosts.empty()) {
    t.master_addr = slurm.hosts.front();
  } else if (r.source == "torchrun") {
    throw Error("RANK/WORLD_SIZE are set but MASTER_ADDR is not; torchrun sets MASTER_ADDR and MASTER_PORT");
  }
  if (flags.master_port) {
    t.master_port = *flags.master_port;
  } else if (auto p = env_value(env, "MASTER_PORT")) {
    t.master_port = static_cast<int>(parse_integer(*p, "MASTER_PORT"));
  } else if (r.source == "slurm" && env_value(env, "SLURM_JOB_ID")) {
    auto step = env_value(env, "SLURM_STEP_ID");
    t.master_port = slurm_master_port(parse_integer(*env_value(env, "SLURM_JOB_ID"), "SLURM_JOB_ID"),
                                      step ? parse_integer(*step, "SLURM_STEP_ID") : 0);
  } else if (r.source == "torchrun") {
    throw Error("RANK/WORLD_SIZE are set but MASTER_PORT is not; torchrun sets MASTER_ADDR and MASTER_PORT");
  } else if (r.source == "single process") {
    t.master_port = 0;  // a port the kernel picks when the store is served: two runs never collide
    return;
  }
  if (t.master_port < 1 || t.master_port > 65535)
    throw Error("master port " + std::to_string(t.master_port) + " (--master-port or MASTER_PORT) must be in 1..65535");
}

}  // namespace

ResolvedTopology resolve_topology(const TopologyFlags& flags, const Environment& env) {
  ResolvedTopology r;
  resolve_rank(flags, env, r);
  const SlurmNode slurm = r.source == "slurm" ? slurm_node(env) : SlurmNode{};
  resolve_node(flags, env, slurm, r);
  resolve_master(flags, env, slurm, r);
  return r;
}

std::string describe(const ResolvedTopology& r) {
  const Topology& t = r.topology;
  return "rank " + std::to_string(t.rank) + "/" + std::to_string(t.world_size) + " local " +
         std::to_string(t.local_rank) + "/" + std::to_string(t.local_world_size) + " node " +
         std::to_string(t.node_rank) + "/" + std::to_string(t.num_nodes) + " master " + t.master_addr + ":" +
         (t.master_port ? std::to_string(t.master_port) : "any free port") + " (" + r.source + ")";
}

}  // namespace fsdpx
