// Topology from flags, torchrun and Slurm; hostlists and tasks-per-node (table-driven).
#include <functional>

#include <gtest/gtest.h>

#include "test_paths.h"

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/cpu_resources.h"
#include "fsdpx/framework/runtime/topology_resolver.h"

namespace fsdpx {
namespace {

using test::error_of;

TEST(Hostlist, Expands) {
  struct Case { const char* in; std::vector<std::string> out; };
  const std::vector<Case> cases = {
      {"node1", {"node1"}},
      {"a,b", {"a", "b"}},
      {"gpu[01-04,07],login2", {"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login2"}},
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      {"rack[1-2]-n[1-2]", {"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}},
      {"x[3]", {"x3"}},
      {"a[1-2].cluster,b", {"a1.cluster", "a2.cluster", "b"}},
  };
  for (const auto& c : cases) EXPECT_EQ(expand_hostlist(c.in), c.out) << c.in;
}

TEST(Hostlist, RejectsMalformed) {
  EXPECT_EQ(error_of([] { expand_hostlist("gpu[01-04"); }), "malformed hostlist 'gpu[01-04': unbalanced brackets");
  EXPECT_EQ(error_of([] { expand_hostlist("gpu[4-1]"); }), "malformed hostlist 'gpu[4-1]': range '4-1' runs backwards");
  EXPECT_EQ(error_of([] { expand_hostlist("gpu[a-b]"); }),
            "malformed hostlist 'gpu[a-b]': 'a-b' is not a number or a range");
  EXPECT_EQ(error_of([] { expand_hostlist("a,,b"); }), "malformed hostlist 'a,,b': empty host name");
  // Found by tests/fuzz/fuzz_hostlist: numbers beyond std::stoll, and groups that multiply.
  EXPECT_EQ(
      error_of([] { expand_hostlist("n[1234567890123456789-1234567890123456790]"); }),
      "malformed hostlist 'n[1234567890123456789-1234567890123456790]': '1234567890123456789-1234567890123456790' has "
      "numbers of more than 18 digits");
  EXPECT_EQ(error_of([] { expand_hostlist("a[0-99999]b[0-99999]"); }),
            "malformed hostlist 'a[0-99999]b[0-99999]': more than 1000000 hosts");
  std::string ranges = "a[0-99999";  // one group's ranges add up too
  for (int i = 0; i < 10; ++i) ranges += ",0-99999";
  EXPECT_EQ(error_of([&] { expand_hostlist(ranges + "]"); }),
            "malformed hostlist '" + ranges + "]': more than 1000000 hosts");
  // A million names is a count, not a size: long names stop at 64 MiB (this was 4 GB of names).
  const std::string long_names = "a[0-999][0-999]" + std::string(4000, 'x');
  EXPECT_EQ(error_of([&] { expand_hostlist(long_names); }),
            "malformed hostlist '" + long_names.substr(0, 200) + "': its names come to more than 64 MiB");
}

TEST(TasksPerNode, Expands) {
  struct Case { const char* in; std::vector<int> out; };
  const std::vector<Case> cases = {
      {"4", {4}}, {"2(x3)", {2, 2, 2}}, {"2(x3),1", {2, 2, 2, 1}}, {"1,2(x2),3", {1, 2, 2, 3}}};
  for (const auto& c : cases) EXPECT_EQ(expand_tasks_per_node(c.in), c.out) << c.in;
  EXPECT_EQ(error_of([] { expand_tasks_per_node("2(3)"); }),
            "malformed SLURM_TASKS_PER_NODE '2(3)': '2(3)' is neither N nor N(xM)");
  EXPECT_EQ(error_of([] { expand_tasks_per_node("0"); }),
            "malformed SLURM_TASKS_PER_NODE '0': '0' has a count below 1");
}

const Environment kTorchrun = {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                               {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"},
                               {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29400"}};
const Environment kSlurm = {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "1"},
                            {"SLURM_NODEID", "2"}, {"SLURM_NNODES", "4"},
                            {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                            {"SLURM_JOB_NODELIST", "gpu[01-03,07]"}, {"SLURM_JOB_ID", "123456"}};

TEST(Topology, SinglProcessByDefault) {
  auto r = resolve_topology({}, {});
  EXPECT_EQ(r.source, "single process");
  EXPECT_EQ(describe(r), "rank 0/1 local 0/1 node 0/1 master 127.0.0.1:any free port (single process)");
  EXPECT_EQ(r.topology.master_port, 0);
}

TEST(Topology, Torchrun) {
  auto r = resolve_topology({}, kTorchrun);
  EXPECT_EQ(describe(r), "rank 3/4 local 1/2 node 1/2 master 10.0.0.1:29400 (torchrun)");
}

TEST(Topology, Slurm) {
  auto r = resolve_topology({}, kSlurm);
  EXPECT_EQ(describe(r), "rank 5/7 local 1/2 node 2/4 master gpu01:" +
                             std::to_string(slurm_master_port(123456)) + " (slurm)");
  EXPECT_EQ(slurm_master_port(123456), 13456);
  EXPECT_EQ(slurm_master_port(123456, 1), 21375);  // another step of the job, another port
  Environment step = kSlurm;
  step["SLURM_STEP_NODELIST"] = "gpu03";  // srun -w gpu03 inside the allocation
  step["SLURM_STEP_ID"] = "1";
  EXPECT_EQ(resolve_topology({}, step).topology.master_addr, "gpu03");
  EXPECT_EQ(resolve_topology({}, step).topology.master_port, 21375);
  Environment last = kSlurm;
  last["SLURM_PROCID"] = "6";
  last["SLURM_NODEID"] = "3";
  last["SLURM_LOCALID"] = "0";
  EXPECT_EQ(resolve_topology({}, last).topology.local_world_size, 1);  // the "1" of 2(x3),1
}

TEST(Topology, FlagsWinOverTorchrunWhichWinsOverSlurm) {
  Environment both = kSlurm;
  both.insert(kTorchrun.begin(), kTorchrun.end());
  EXPECT_EQ(describe(resolve_topology({}, both)), "rank 3/4 local 1/2 node 1/2 master 10.0.0.1:29400 (torchrun)");
  TopologyFlags f;
  f.rank = 0;
  f.world_size = 4;
  f.master_port = 1234;
  EXPECT_EQ(describe(resolve_topology(f, both)), "rank 0/4 local 1/2 node 1/2 master 10.0.0.1:1234 (flags)");
  // Under Slurm, MASTER_ADDR/MASTER_PORT win over the node list and the job id.
  Environment s = kSlurm;
  s["MASTER_ADDR"] = "head";
  s["MASTER_PORT"] = "2222";
  EXPECT_EQ(resolve_topology({}, s).topology.master_addr, "head");
  EXPECT_EQ(resolve_topology({}, s).topology.master_port, 2222);
}

TEST(Topology, PartialOrContradictorySettingsNameTheVariables) {
  EXPECT_EQ(error_of([] { resolve_topology({}, {{"RANK", "1"}}); }),
            "RANK is set but WORLD_SIZE is not; torchrun sets both");
  EXPECT_EQ(error_of([] { resolve_topology({}, {{"WORLD_SIZE", "2"}}); }),
            "WORLD_SIZE is set but RANK is not; torchrun sets both");
  EXPECT_EQ(error_of([] {
              resolve_topology({}, {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"},
                                    {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
            }),
            "local rank 2 (LOCAL_RANK) must be below the local world size 2 (LOCAL_WORLD_SIZE)");
  EXPECT_EQ(error_of([] {
              resolve_topology({}, {{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
            }),
            "rank 4 is outside world size 4 (RANK/WORLD_SIZE); ranks run 0..3");
  EXPECT_EQ(error_of([] { resolve_topology({}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}); }),
            "RANK/WORLD_SIZE are set but MASTER_ADDR is not; torchrun sets MASTER_ADDR and MASTER_PORT");
  EXPECT_EQ(error_of([] {
              resolve_topology({}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "http"}});
            }),
            "MASTER_PORT='http' is not an integer");
  EXPECT_EQ(error_of([] { resolve_topology({}, {{"SLURM_PROCID", "0"}}); }),
            "SLURM_PROCID is set but SLURM_NTASKS is not; run the workers with srun");
  TopologyFlags f;
  f.rank = 1;
  EXPECT_EQ(error_of([&] { resolve_topology(f, {}); }), "--rank is given but --world-size is not; give both");
  // Settings of a source that does not decide are not checked: flags win over a stray RANK, and
  // torchrun inside a batch step (SLURM_PROCID without SLURM_NTASKS) is fine.
  TopologyFlags g;
  g.rank = 0;
  g.world_size = 1;
  EXPECT_EQ(resolve_topology(g, {{"RANK", "3"}}).source, "flags");
  Environment tr = kTorchrun;
  tr["SLURM_PROCID"] = "0";
  EXPECT_EQ(resolve_topology({}, tr).source, "torchrun");
  Environment s = kSlurm;
  s["SLURM_NODEID"] = "9";
  s["SLURM_NNODES"] = "";
  EXPECT_EQ(error_of([&] { resolve_topology({}, s); }),
            "SLURM_NODEID=9 but SLURM_TASKS_PER_NODE='2(x3),1' describes only 4 nodes");
}

// Threads per rank: the user's OMP_NUM_THREADS, else Slurm's CPUs per task, else the affinity
// mask shared by the node's ranks (2 ranks on 2 cores: one thread each, not two).
TEST(Threads, ChosenFromTheCoresEachRankMayUse) {
  EXPECT_EQ(choose_threads({}, 2, 2).threads, 1);
  EXPECT_EQ(choose_threads({}, 2, 2).why, "2 CPU(s) in the affinity mask / 2 local rank(s); OMP_NUM_THREADS overrides");
  EXPECT_EQ(choose_threads({}, 4, 16).threads, 4);
  EXPECT_EQ(choose_threads({}, 4, 2).threads, 1);  // never 0
  EXPECT_EQ(choose_threads({{"OMP_NUM_THREADS", "3"}}, 2, 2).threads, 3);
  EXPECT_EQ(choose_threads({{"OMP_NUM_THREADS", "3"}}, 2, 2).why, "OMP_NUM_THREADS");
  EXPECT_EQ(choose_threads({{"SLURM_CPUS_PER_TASK", "8"}}, 4, 64).threads, 8);
  EXPECT_EQ(error_of([] {
              choose_threads({{"OMP_NUM_THREADS", "many"}}, 2, 2);
            }),
            "OMP_NUM_THREADS='many' is not an integer");
  EXPECT_EQ(error_of([] { choose_threads({{"OMP_NUM_THREADS", "0"}}, 2, 2); }),
            "OMP_NUM_THREADS=0: a rank needs at least 1 thread; unset it to let fsdpx choose");
  EXPECT_GE(affinity_cpus(), 1);
}

TEST(Threads, NativeBf16FromTheCpuFlags) {
  EXPECT_TRUE(has_fast_bf16(" fpu avx2 avx512f avx512_bf16 avx512_vnni"));
  EXPECT_TRUE(has_fast_bf16("avx2 amx_bf16 amx_tile"));
  EXPECT_FALSE(has_fast_bf16(" fpu sse4_2 avx2 fma"));
  EXPECT_FALSE(has_fast_bf16("avx512_bf16x"));  // whole flags only
}

}  // namespace
}  // namespace fsdpx
