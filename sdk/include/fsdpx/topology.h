// fsdpx/topology.h: where this process sits among the training processes.
#pragma once

#include <string>

namespace fsdpx {

struct Topology {
  int rank = 0;              // global rank, 0 <= rank < world_size
  int world_size = 1;
  int local_rank = 0;        // rank within this node
  int local_world_size = 1;  // processes on this node
  int node_rank = 0;         // index of this node
  int num_nodes = 1;
  std::string master_addr = "127.0.0.1";  // rendezvous host (rank 0's)
  int master_port = 29500;                // rendezvous port; 0 (one process only): any free port
};

}  // namespace fsdpx
