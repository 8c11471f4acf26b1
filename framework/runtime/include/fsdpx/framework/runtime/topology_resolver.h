// Where this process sits among the training processes, from flags, torchrun or Slurm.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fsdpx/export.h"
#include "fsdpx/topology.h"

namespace fsdpx {

// Explicit settings (command-line flags); unset fields fall through to the environment.
struct TopologyFlags {
  std::optional<int> rank, world_size, local_rank, local_world_size, node_rank, num_nodes;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

struct ResolvedTopology {
  Topology topology;
  std::string source;  // "flags", "torchrun", "slurm" or "single process": where rank came from
};

using Environment = std::map<std::string, std::string>;

// The environment of this process, as a map.
FSDPX_API Environment process_environment();

// Resolves the topology. Rank and world size come, together, from the first of: flags,
// torchrun's RANK/WORLD_SIZE, Slurm's SLURM_PROCID/SLURM_NTASKS, or a single process. The other
// fields come field by field from flags, then from that same source's variables (torchrun's
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE; Slurm's SLURM_LOCALID,
// SLURM_NODEID, SLURM_NNODES, tasks per node), then from the rest (nodes of local_world_size
// ranks each). Slurm's variables are ignored when torchrun's are set: torchrun started inside
// an allocation has SLURM_PROCID of its node, not of its worker. MASTER_ADDR/MASTER_PORT apply
// under Slurm too; without them Slurm's master is the first host of the step's nodes
// (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST) and the port derives from the job and step ids. Throws fsdpx::Error
// naming the variables involved when settings are partial (RANK without WORLD_SIZE), malformed, or contradict each
// other (LOCAL_RANK >= LOCAL_WORLD_SIZE).
FSDPX_API ResolvedTopology resolve_topology(const TopologyFlags& flags, const Environment& env);

// Expands a Slurm hostlist: "gpu[01-04,07],login2" -> gpu01 gpu02 gpu03 gpu04 gpu07 login2.
// Zero padding is kept; several bracket groups in one name are expanded in order. Throws
// fsdpx::Error on malformed input.
FSDPX_API std::vector<std::string> expand_hostlist(const std::string& hostlist);

// Expands SLURM_TASKS_PER_NODE: "2(x3),1" -> 2 2 2 1. Throws fsdpx::Error on malformed input.
FSDPX_API std::vector<int> expand_tasks_per_node(const std::string& spec);

// The rendezvous port of a Slurm job step: 10000 + (SLURM_JOB_ID + 7919 x SLURM_STEP_ID) % 20000,
// the same on every node of the step, different for concurrent steps of one job.
FSDPX_API int slurm_master_port(long long job_id, long long step_id = 0);

// One line: "rank 1/4 local 1/2 node 0/2 master 127.0.0.1:29500 (torchrun)".
FSDPX_API std::string describe(const ResolvedTopology& t);

}  // namespace fsdpx
