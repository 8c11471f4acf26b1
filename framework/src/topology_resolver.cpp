#include "fsdpx/framework/topology_resolver.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "fsdpx/error.h"

extern char** environ;

namespace fsdpx {
namespace {

std::optional<std::string> get(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

long long parse_int(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0')
    throw Error(what + "='" + text + "' is not an integer");
  return v;
}

std::optional<int> get_int(const Environment& env, const std::string& name) {
  auto v = get(env, name);
  if (!v) return std::nullopt;
  long long n = parse_int(*v, name);
  if (n < 0 || n > 1 << 30) throw Error(name + "=" + *v + " is out of range");
  return static_cast<int>(n);
}

// Both or neither; returns whether both are set.
bool pair(const Environment& env, const std::string& a, const std::string& b, const std::string& who) {
  bool ha = get(env, a).has_value(), hb = get(env, b).has_value();
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

std::vector<std::string> expand_hostlist(const std::string& hostlist) {
  // Split at commas outside brackets.
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : hostlist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) throw Error("malformed hostlist '" + hostlist + "': unbalanced brackets");
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw Error("malformed hostlist '" + hostlist + "': unbalanced brackets");
  items.push_back(cur);

  std::vector<std::string> hosts;
  for (const auto& item : items) {
    if (item.empty()) throw Error("malformed hostlist '" + hostlist + "': empty host name");
    // Expand the first bracket group, then recurse on the rest of the name.
    auto open = item.find('[');
    if (open == std::string::npos) {
      hosts.push_back(item);
      continue;
    }
    auto close = item.find(']', open);
    const std::string prefix = item.substr(0, open), body = item.substr(open + 1, close - open - 1),
                      suffix = item.substr(close + 1);
    if (body.empty()) throw Error("malformed hostlist '" + hostlist + "': empty brackets");
    std::vector<std::string> middles;
    size_t start = 0;
    while (start <= body.size()) {
      size_t comma = body.find(',', start);
      if (comma == std::string::npos) comma = body.size();
      std::string range = body.substr(start, comma - start);
      auto dash = range.find('-');
      std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
      auto digits = [](const std::string& s) {
        return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
      };
      if (!digits(lo) || !digits(hi))
        throw Error("malformed hostlist '" + hostlist + "': '" + range + "' is not a number or a range");
      long long a = std::stoll(lo), b = std::stoll(hi);
      if (b < a) throw Error("malformed hostlist '" + hostlist + "': range '" + range + "' runs backwards");
      if (b - a > 100000) throw Error("malformed hostlist '" + hostlist + "': range '" + range + "' is too large");
      size_t width = lo.size();
      for (long long v = a; v <= b; ++v) {
        std::string s = std::to_string(v);
        if (s.size() < width) s = std::string(width - s.size(), '0') + s;
        middles.push_back(s);
      }
      start = comma + 1;
    }
    for (const auto& m : middles) {
      std::string name = prefix + m + suffix;
      if (name.find('[') != std::string::npos) {
        auto more = expand_hostlist(name);
        hosts.insert(hosts.end(), more.begin(), more.end());
      } else {
        hosts.push_back(name);
      }
    }
  }
  return hosts;
}

std::vector<int> expand_tasks_per_node(const std::string& spec) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    std::string item = spec.substr(start, comma - start);
    long long count = 0, repeat = 1;
    auto paren = item.find('(');
    try {
      if (paren == std::string::npos) {
        count = parse_int(item, "SLURM_TASKS_PER_NODE item");
      } else {
        if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')')
          throw Error("");
        count = parse_int(item.substr(0, paren), "count");
        repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3), "repeat");
      }
    } catch (const Error&) {
      throw Error("malformed SLURM_TASKS_PER_NODE '" + spec + "': '" + item +
                  "' is neither N nor N(xM)");
    }
    if (count < 1 || repeat < 1 || repeat > 100000)
      throw Error("malformed SLURM_TASKS_PER_NODE '" + spec + "': '" + item + "' has a count below 1");
    for (long long i = 0; i < repeat; ++i) out.push_back(static_cast<int>(count));
    start = comma + 1;
  }
  return out;
}

int slurm_master_port(long long job_id, long long step_id) {
  return 10000 + static_cast<int>((job_id + 7919 * std::max(0LL, step_id)) % 20000);
}

ResolvedTopology resolve_topology(const TopologyFlags& flags, const Environment& env) {
  ResolvedTopology r;
  Topology& t = r.topology;
  // Each source's own consistency is checked only when that source decides.
  const bool by_flags = flags.rank || flags.world_size;
  const bool torchrun = !by_flags && pair(env, "RANK", "WORLD_SIZE", "torchrun");
  const bool slurm = !by_flags && !torchrun && get(env, "SLURM_PROCID").has_value();
  if (slurm && !get(env, "SLURM_NTASKS") && !get(env, "SLURM_NPROCS"))
    throw Error("SLURM_PROCID is set but SLURM_NTASKS is not; run the workers with srun");

  // Rank and world size, from one source.
  if (by_flags) {
    if (!flags.rank || !flags.world_size)
      throw Error(std::string(flags.rank ? "--rank" : "--world-size") + " is given but " +
                  (flags.rank ? "--world-size" : "--rank") + " is not; give both");
    t.rank = *flags.rank;
    t.world_size = *flags.world_size;
    r.source = "flags";
  } else if (torchrun) {
    t.rank = *get_int(env, "RANK");
    t.world_size = *get_int(env, "WORLD_SIZE");
    r.source = "torchrun";
  } else if (slurm) {
    t.rank = *get_int(env, "SLURM_PROCID");
    t.world_size = get(env, "SLURM_NTASKS") ? *get_int(env, "SLURM_NTASKS") : *get_int(env, "SLURM_NPROCS");
    r.source = "slurm";
  } else {
    r.source = "single process";
  }
  const std::string rank_names = r.source == "flags"      ? "--rank/--world-size"
                                 : r.source == "torchrun" ? "RANK/WORLD_SIZE"
                                 : r.source == "slurm"    ? "SLURM_PROCID/SLURM_NTASKS"
                                                          : "defaults";
  if (t.world_size < 1) throw Error("world size " + std::to_string(t.world_size) + " (" + rank_names + ") must be at least 1");
  if (t.rank < 0 || t.rank >= t.world_size)
    throw Error("rank " + std::to_string(t.rank) + " is outside world size " +
                std::to_string(t.world_size) + " (" + rank_names + "); ranks run 0.." +
                std::to_string(t.world_size - 1));

  // Slurm's view of this node, if Slurm launched us.
  std::optional<int> slurm_local, slurm_local_size, slurm_node, slurm_nodes;
  std::vector<std::string> slurm_hosts;
  if (r.source == "slurm") {  // Slurm's per-node fields describe Slurm's tasks only
    slurm_local = get_int(env, "SLURM_LOCALID");
    slurm_node = get_int(env, "SLURM_NODEID");
    slurm_nodes = get_int(env, "SLURM_NNODES");
    // The step's nodes, where the tasks (and rank 0) run; the job's when there is no step.
    std::optional<std::string> list;
    for (const char* v : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
      if (!list) list = get(env, v);
    if (list) {
      slurm_hosts = expand_hostlist(*list);
      if (!slurm_nodes) slurm_nodes = static_cast<int>(slurm_hosts.size());
    }
    if (auto per = get(env, "SLURM_NTASKS_PER_NODE")) {
      slurm_local_size = static_cast<int>(parse_int(*per, "SLURM_NTASKS_PER_NODE"));
    } else if (auto spec = get(env, "SLURM_TASKS_PER_NODE")) {
      auto counts = expand_tasks_per_node(*spec);
      int node = slurm_node.value_or(0);
      if (node >= static_cast<int>(counts.size()))
        throw Error("SLURM_NODEID=" + std::to_string(node) + " but SLURM_TASKS_PER_NODE='" + *spec +
                    "' describes only " + std::to_string(counts.size()) + " nodes");
      slurm_local_size = counts[node];
    }
  }

  // torchrun's per-node fields apply when rank came from flags or torchrun, not under Slurm.
  const bool use_torchrun = r.source != "slurm";
  auto pick = [&](const std::optional<int>& flag, const char* torch_var, const std::optional<int>& from_slurm,
                  int fallback, std::string& origin, const std::string& flag_name) {
    if (flag) { origin = flag_name; return *flag; }
    if (auto v = use_torchrun ? get_int(env, torch_var) : std::nullopt) { origin = torch_var; return *v; }
    if (from_slurm) { origin = "Slurm"; return *from_slurm; }
    origin = "default";
    return fallback;
  };
  std::string lr_from, lws_from, node_from, nodes_from;
  t.local_world_size = pick(flags.local_world_size, "LOCAL_WORLD_SIZE", slurm_local_size, t.world_size,
                            lws_from, "--local-world-size");
  t.local_rank = pick(flags.local_rank, "LOCAL_RANK", slurm_local,
                      t.local_world_size > 0 ? t.rank % t.local_world_size : 0, lr_from, "--local-rank");
  if (t.local_world_size < 1 || t.local_world_size > t.world_size)
    throw Error("local world size " + std::to_string(t.local_world_size) + " (" + lws_from +
                ") must be between 1 and the world size " + std::to_string(t.world_size));
  if (t.local_rank >= t.local_world_size)
    throw Error("local rank " + std::to_string(t.local_rank) + " (" + lr_from +
                ") must be below the local world size " + std::to_string(t.local_world_size) + " (" +
                lws_from + ")");
  int default_nodes = (t.world_size + t.local_world_size - 1) / t.local_world_size;
  t.num_nodes = pick(flags.num_nodes, "GROUP_WORLD_SIZE", slurm_nodes, default_nodes, nodes_from, "--num-nodes");
  t.node_rank = pick(flags.node_rank, "GROUP_RANK", slurm_node, t.rank / t.local_world_size, node_from,
                     "--node-rank");
  if (t.num_nodes < 1 || t.node_rank >= t.num_nodes)
    throw Error("node rank " + std::to_string(t.node_rank) + " (" + node_from +
                ") must be below the number of nodes " + std::to_string(t.num_nodes) + " (" + nodes_from + ")");

  // Rendezvous address.
  if (flags.master_addr) {
    t.master_addr = *flags.master_addr;
  } else if (auto a = get(env, "MASTER_ADDR")) {
    t.master_addr = *a;
  } else if (r.source == "slurm" && !slurm_hosts.empty()) {
    t.master_addr = slurm_hosts.front();
  } else if (r.source == "torchrun") {
    throw Error("RANK/WORLD_SIZE are set but MASTER_ADDR is not; torchrun sets MASTER_ADDR and MASTER_PORT");
  }
  if (flags.master_port) {
    t.master_port = *flags.master_port;
  } else if (auto p = get(env, "MASTER_PORT")) {
    t.master_port = static_cast<int>(parse_int(*p, "MASTER_PORT"));
  } else if (r.source == "slurm" && get(env, "SLURM_JOB_ID")) {
    auto step = get(env, "SLURM_STEP_ID");
    t.master_port = slurm_master_port(parse_int(*get(env, "SLURM_JOB_ID"), "SLURM_JOB_ID"),
                                      step ? parse_int(*step, "SLURM_STEP_ID") : 0);
  } else if (r.source == "torchrun") {
    throw Error("RANK/WORLD_SIZE are set but MASTER_PORT is not; torchrun sets MASTER_ADDR and MASTER_PORT");
  }
  if (t.master_port < 1 || t.master_port > 65535)
    throw Error("master port " + std::to_string(t.master_port) + " (--master-port or MASTER_PORT) must be in 1..65535");
  return r;
}

std::string describe(const ResolvedTopology& r) {
  const Topology& t = r.topology;
  return "rank " + std::to_string(t.rank) + "/" + std::to_string(t.world_size) + " local " +
         std::to_string(t.local_rank) + "/" + std::to_string(t.local_world_size) + " node " +
         std::to_string(t.node_rank) + "/" + std::to_string(t.num_nodes) + " master " +
         t.master_addr + ":" + std::to_string(t.master_port) + " (" + r.source + ")";
}

}  // namespace fsdpx
