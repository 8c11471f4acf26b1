// The runtime with real processes: collectives at 2 and 4 ranks through the real Gloo,
// sub-groups as 2 nodes x 2, the local launcher, and the fault cases. Every process runs under
// a hard timeout (run_command), so nothing here can hang the suite.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include <ATen/Version.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "fsdpx/framework/runtime/c10d_backends.h"
#include "fsdpx/framework/runtime/communicator.h"
#include "test_paths.h"

namespace fsdpx {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using fsdpx::test::train;
using fsdpx::test::comm_worker;

// One rank started by hand, with torchrun's variables.
std::string rank_cmd(int rank, int world, int port, const std::string& args) {
  return "env RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) +
         " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " + comm_worker() + " " + args;
}

TEST(GlooBackend, SymbolsExistAndWork) {
  // One rank over an in-process store: the exported factory path end to end.
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto backend = make_gloo_backend(store, 0, 1, std::chrono::seconds(10));
  EXPECT_EQ(backend->getBackendName(), "gloo");
  EXPECT_EQ(backend->getSize(), 1);
  std::vector<at::Tensor> t{at::ones({3})};
  backend->allreduce(t)->wait();
  EXPECT_TRUE(t[0].equal(at::ones({3})));
}

}  // namespace
}  // namespace fsdpx

// Sized operator delete, replaced for this test binary so that the next test can see the size
// LibTorch's own destructor frees the Gloo object with. It frees like the default one.
namespace {
std::atomic<void*> g_watched{nullptr};
std::atomic<size_t> g_freed_size{0};
}  // namespace
__attribute__((visibility("default"))) void operator delete(void* p, std::size_t size) noexcept {
  if (p && p == g_watched.load()) g_freed_size.store(size);
  std::free(p);
}
__attribute__((visibility("default"))) void operator delete(void* p) noexcept { std::free(p); }

namespace fsdpx {
namespace {

TEST(GlooBackend, ObjectSizeMatchesLibTorch) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto backend = make_gloo_backend(store, 0, 1, std::chrono::seconds(10));
  g_watched.store(backend.get());
  backend.reset();
  g_watched.store(nullptr);
  EXPECT_EQ(g_freed_size.load(), kGlooObjectBytes)
      << "LibTorch's ProcessGroupGloo is " << g_freed_size.load() << " bytes, not kGlooObjectBytes ("
      << kGlooObjectBytes << "): update it in c10d_backends.h";
}

// The Gloo object's size was read from one LibTorch; any other found at run time is refused
// before make_gloo_backend builds anything (the running one passes).
TEST(GlooBackend, OtherLibTorchVersionsAreRefused) {
  EXPECT_EQ(test::error_of([] { check_gloo_object_size_applies(at::show_config()); }), "(no error)");
  EXPECT_EQ(
      test::error_of([] {
        check_gloo_object_size_applies("  - Build settings: BLAS_INFO=mkl, TORCH_VERSION=2.12.0, USE_CUDA=ON\n");
      }),
      "the LibTorch loaded at run time is 2.12.0; fsdpx builds the Gloo backend in 488 bytes, the size of "
      "c10d::ProcessGroupGloo in LibTorch 2.11.0 only: run with LibTorch 2.11.0 (the one fsdpx was built against; "
      "scripts/setup.sh installs it)");
  EXPECT_EQ(
      test::error_of([] { check_gloo_object_size_applies("PyTorch built with:\n  - C++ Version: 201703\n"); }),
      "the LibTorch loaded at run time is of unknown version (its build configuration names no TORCH_VERSION); "
      "fsdpx builds the Gloo backend in 488 bytes, the size of c10d::ProcessGroupGloo in LibTorch 2.11.0 only: run "
      "with LibTorch 2.11.0 (the one fsdpx was built against; scripts/setup.sh installs it)");
}

TEST(Runtime, SubgroupsOfSomeRanksThenOfAll) {
  auto r = test::run_command(comm_worker() + " --nproc-per-node 4 --scenario subgroups --collective-timeout 20");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int k = 0; k < 4; ++k)
    EXPECT_NE(r.out.find("[rank" + std::to_string(k) + "]: subgroups ok"), std::string::npos) << r.out;
}

TEST(Runtime, CollectivesAtTwoRanks) {
  auto r = test::run_command(comm_worker() + " --nproc-per-node 2 --scenario collectives");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[rank0]: collectives ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank1]: collectives ok"), std::string::npos) << r.out;
}

TEST(Runtime, CollectivesAtFourRanks) {
  auto r = test::run_command(comm_worker() + " --nproc-per-node 4 --scenario collectives");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int k = 0; k < 4; ++k)
    EXPECT_NE(r.out.find("[rank" + std::to_string(k) + "]: collectives ok"), std::string::npos) << r.out;
}

TEST(Runtime, HybridGroupsAsTwoNodesOfTwo) {
  // Four processes as two "nodes" of two, the way two torchrun agents would start them.
  std::string cmd;
  const int port = test::free_port();
  for (int r = 0; r < 4; ++r)
    cmd += "env LOCAL_RANK=" + std::to_string(r % 2) + " LOCAL_WORLD_SIZE=2 GROUP_RANK=" + std::to_string(r / 2) +
           " GROUP_WORLD_SIZE=2 " + rank_cmd(r, 4, port, "--scenario hybrid") + " | sed \"s/^/[rank" +
           std::to_string(r) + "]: /\" & ";
  auto r = test::run_command("bash -c '" + cmd + "wait'");
  // Shard groups {0,1} {2,3}; replicate groups {0,2} {1,3}.
  EXPECT_NE(r.out.find("[rank0]: hybrid ok shard=0/2 sum=1 replicate=0/2 sum=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank1]: hybrid ok shard=1/2 sum=1 replicate=0/2 sum=4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank2]: hybrid ok shard=0/2 sum=5 replicate=1/2 sum=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank3]: hybrid ok shard=1/2 sum=5 replicate=1/2 sum=4"), std::string::npos) << r.out;
}

TEST(Runtime, CountingWrapperRecordsBytes) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  struct One final : Communicator {
    int rank() const override { return 0; }
    int size() const override { return 4; }  // pretend: only the counting matters here
    const std::string& name() const override { return n; }
    Work all_gather(at::Tensor, at::Tensor) override { return Work(); }
    Work reduce_scatter(at::Tensor, at::Tensor, ReduceOp) override { return Work(); }
    Work all_to_all(at::Tensor, at::Tensor) override { return Work(); }
    Work all_reduce(at::Tensor, ReduceOp) override { return Work(); }
    Work broadcast(at::Tensor, int) override { return Work(); }
    Work barrier() override { return Work(); }
    std::string n = "fake";
  };
  CountingCommunicator c(std::make_shared<One>());
  c.all_gather(at::zeros({400}), at::zeros({100}));                       // 1600 B payload
  c.reduce_scatter(at::zeros({100}, at::kBFloat16), at::zeros({400}, at::kBFloat16), ReduceOp::Sum);  // 800 B
  c.all_reduce(at::zeros({100}), ReduceOp::Avg);                          // 400 B
  c.broadcast(at::zeros({10}), 0);
  c.all_to_all(at::zeros({200}), at::zeros({200}));                       // 800 B
  auto s = c.stats();
  EXPECT_EQ(s[Collective::AllGather].payload_bytes, 1600);
  EXPECT_EQ(s[Collective::AllGather].sent_bytes, 1200);      // 3/4 of it
  EXPECT_EQ(s[Collective::ReduceScatter].sent_bytes, 600);
  EXPECT_EQ(s[Collective::AllReduce].sent_bytes, 600);       // 2 x 3/4
  EXPECT_EQ(s[Collective::Broadcast].sent_bytes, 40);        // the root sends it
  EXPECT_EQ(s[Collective::AllToAll].sent_bytes, 600);        // the 3 chunks for the others
  EXPECT_EQ(s.sent_bytes(), 1200 + 600 + 600 + 40 + 600);
  c.reset();
  EXPECT_EQ(c.stats().sent_bytes(), 0);
}

// The same topology from the launcher, from torchrun --no-python, and (in the Slurm test)
// from srun.
std::set<std::string> topology_lines(const std::string& out) {
  std::set<std::string> lines;
  std::regex re(
      "topology (rank=\\d+ world_size=\\d+ local_rank=\\d+ local_world_size=\\d+ node_rank=\\d+ num_nodes=\\d+)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) lines.insert((*it)[1]);
  return lines;
}

TEST(Launcher, TopologyMatchesTorchrun) {
  auto mine = test::run_command(train() + " --nproc-per-node 2 --print-topology");
  ASSERT_EQ(mine.exit_code, 0) << mine.err;
  const std::string torchrun = (fs::path(test::venv_python()).parent_path() / "torchrun").string();
  auto theirs = test::run_command(torchrun + " --standalone --nproc-per-node 2 --no-python " + train() +
                                  " --print-topology");
  ASSERT_EQ(theirs.exit_code, 0) << theirs.err;
  EXPECT_EQ(topology_lines(mine.out).size(), 2u) << mine.out;
  EXPECT_EQ(topology_lines(mine.out), topology_lines(theirs.out)) << mine.out << "\n---\n" << theirs.out;
}

TEST(Launcher, CheckCommPassesAndOutputIsPrefixedByRank) {
  auto r = test::run_command(train() + " --nproc-per-node 2 --check-comm --rendezvous-timeout 30");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank0]: fsdpx-train: communication check passed on 2 ranks (gloo)"), std::string::npos)
      << r.out;
}

TEST(Launcher, AFailingRankStopsTheOthers) {
  auto start = Clock::now();
  auto r = test::run_command(comm_worker() + " --nproc-per-node 3 --scenario exit --fail-rank 1 --code 7");
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_NE(r.err.find("comm_worker: rank 1 exited with status 7; stopping the other ranks"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("comm_worker: failed: rank 1 exited with status 7"), std::string::npos) << r.err;
  EXPECT_LT(secs, 20.0) << "the sleeping ranks were not stopped within seconds";
}

TEST(Launcher, SigtermReachesEveryWorker) {
  test::TempDir dir;
  // Start the launcher, wait until both workers wrote their pids, SIGTERM the launcher.
  const std::string cmd =
      comm_worker() + " --nproc-per-node 2 --scenario sleep --dir " + dir.path().string() + " & L=$!; "
      "for i in $(seq 100); do [ -f " + (dir.path() / "pid.0").string() + " ] && [ -f " +
      (dir.path() / "pid.1").string() + " ] && break; sleep 0.1; done; "
      "kill -TERM $L; wait $L; echo launcher=$?";
  auto r = test::run_command("bash -c '" + cmd + "'");
  EXPECT_NE(r.out.find("launcher=143"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.err.find("got Terminated; stopping all ranks"), std::string::npos) << r.err;
  for (int k = 0; k < 2; ++k) {
    std::ifstream in(dir.path() / ("pid." + std::to_string(k)));
    int pid = 0;
    in >> pid;
    ASSERT_GT(pid, 0);
    EXPECT_NE(::kill(pid, 0), 0) << "worker " << k << " (pid " << pid << ") is still alive";
  }
}

// The workers are copies of the launcher forked before it did anything (its arguments, with
// --nproc-per-node, are still theirs: no exec gave them new ones), unless FSDPX_EXEC_WORKERS=1
// asks for exec (the arguments without --nproc-per-node). Both run the same; a bad value is refused.
TEST(Launcher, WorkersAreForkedFromTheLauncherUnlessExecIsAsked) {
  for (const std::string exec : {"0", "1"}) {
    test::TempDir dir;
    const std::string env = "FSDPX_EXEC_WORKERS=" + exec + " ";
    const fs::path d = dir.path();
    // Start the launcher, wait until both workers wrote their pids, keep their arguments, stop it.
    test::write_file(d / "run.sh",
                     env + comm_worker() + " --nproc-per-node 2 --scenario sleep --dir " + d.string() + " &\n" +
                         "L=$!\n"
                         "for i in $(seq 200); do [ -s " + (d / "pid.0").string() + " ] && [ -s " +
                         (d / "pid.1").string() + " ] && break; sleep 0.1; done\n"
                         "for r in 0 1; do tr '\\0' ' ' </proc/$(head -1 " + d.string() + "/pid.$r)/cmdline >" +
                         d.string() + "/cmdline.$r; done\n"
                         "kill -TERM $L; wait $L\n");
    test::run_command("timeout 60 bash " + (d / "run.sh").string());
    for (int r = 0; r < 2; ++r) {
      const std::string line = test::read_file(dir.path() / ("cmdline." + std::to_string(r)));
      EXPECT_NE(line.find("--scenario sleep"), std::string::npos) << line;
      EXPECT_EQ(line.find("--nproc-per-node 2") != std::string::npos, exec == "0")
          << "FSDPX_EXEC_WORKERS=" << exec << ": " << line;
    }
  }
  auto bad = test::run_command("env FSDPX_EXEC_WORKERS=yes " + comm_worker() + " --nproc-per-node 2 --scenario exit");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("comm_worker: FSDPX_EXEC_WORKERS must be 0 (workers forked from the launcher) or 1 "
                         "(workers started by exec), got 'yes'"),
            std::string::npos)
      << bad.err;
  EXPECT_EQ(bad.err.find("[rank"), std::string::npos) << bad.err;
}

// A launcher that refuses its run after forking its workers early (a bad option, found before any
// worker is handed its environment) leaves none of them behind: every process still carrying the
// launcher's environment is gone when it exits, and it reaped them itself (this test process is
// made the subreaper of what the launcher leaves, so an unreaped worker would be its child now).
TEST(Launcher, ARefusedRunLeavesNoForkedWorkerBehind) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  test::TempDir dir;
  const std::string mark = "LEFTOVER_MARK_" + std::to_string(::getpid()) + "=" + dir.path().filename().string();
  auto r = test::run_command("env FSDPX_EXEC_WORKERS=0 " + mark + " " + train() +
                             " --nproc-per-node 3 --model.name no_such_model");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("no_such_model"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[rank"), std::string::npos) << r.err;
  std::vector<std::string> left;
  for (const auto& p : fs::directory_iterator("/proc")) {
    std::ifstream in(p.path() / "environ", std::ios::binary);
    const std::string environment((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (environment.find(mark) != std::string::npos) left.push_back(p.path().filename().string());
  }
  EXPECT_TRUE(left.empty()) << "processes left with the launcher's environment: " << left.size() << ", pid "
                            << (left.empty() ? "" : left[0]);
  int status = 0;
  EXPECT_LE(::waitpid(-1, &status, WNOHANG), 0) << "a worker the launcher did not reap";
}

// Faults: ranks started by hand (no launcher, which would stop the survivors itself).


TEST(Faults, RankKilledDuringACollectiveIsNamedBySurvivors) {
  test::TempDir dir;
  const int port = test::free_port();
  const std::string out0 = (dir.path() / "r0").string(), out2 = (dir.path() / "r2").string();
  auto start = Clock::now();
  auto r =
      test::run_command("bash -c '" + rank_cmd(0, 3, port, "--scenario die --collective-timeout 20") + " >" + out0 +
                        " 2>&1 & " + rank_cmd(1, 3, port, "--scenario die") + " >/dev/null 2>&1 & " +
                        rank_cmd(2, 3, port, "--scenario die --collective-timeout 20") + " >" + out2 + " 2>&1 & wait'");
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  for (const auto& f : {out0, out2}) {
    const std::string text = test::read_file(f);
    EXPECT_NE(text.find("all_reduce on group 'world' (ranks 0, 1, 2) failed"), std::string::npos) << text;
    EXPECT_NE(text.find("rank 1 is gone (no heartbeat in "), std::string::npos) << text;
  }
  EXPECT_LT(secs, 30.0);
}

// --watch-peers (on by default with NCCL, where a collective waiting for a lost rank hangs on the
// device instead of failing): a rank killed while the others compute, with no collective to
// fail, is named by the rank that watches it within seconds (3 s without a heartbeat), with its
// node, host and pid; every other rank ends with that message too.
TEST(Faults, ALostRankIsNamedByItsWatcherOutsideAnyCollective) {
  test::TempDir dir;
  const int port = test::free_port();
  const std::string out0 = (dir.path() / "r0").string(), out2 = (dir.path() / "r2").string();
  const std::string args = "--scenario lost --watch-peers";
  auto start = Clock::now();
  test::run_command("bash -c 'timeout 90 " + rank_cmd(0, 3, port, args) + " >" + out0 + " 2>&1 & timeout 90 " +
                    rank_cmd(1, 3, port, args) + " >/dev/null 2>&1 & timeout 90 " + rank_cmd(2, 3, port, args) + " >" +
                    out2 + " 2>&1 & wait'");
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string r0 = test::read_file(out0), r2 = test::read_file(out2);
  // Rank 0 watches rank 1: it names it from the stopped heartbeat; rank 2 ends with its message.
  EXPECT_NE(r0.find("fsdpx: stopping rank 0: rank 1 is gone (no heartbeat in "), std::string::npos) << r0;
  EXPECT_NE(r0.find("seen by rank 0) (node 0, host "), std::string::npos) << r0;
  EXPECT_NE(r2.find("fsdpx: stopping rank 2: rank 0 failed: rank 1 is gone (no heartbeat in "), std::string::npos)
      << r2;
  EXPECT_EQ(r0.find("still running"), std::string::npos) << r0;
  EXPECT_LT(secs, 20.0);
}

TEST(Faults, RendezvousWithAMissingRankTimesOut) {
  const int port = test::free_port();
  auto start = Clock::now();
  auto r = test::run_command(rank_cmd(0, 2, port, "--scenario collectives --rendezvous-timeout 3"));
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "comm_worker: rendezvous at 127.0.0.1:" + std::to_string(port) +
                       " timed out after 3 s: 1 of 2 ranks joined; missing: rank 1 (raise "
                       "--rendezvous-timeout if they are only slow to start)\n");
  EXPECT_LT(secs, 15.0);
}

TEST(Faults, UnreachableMasterIsAClearError) {
  const int port = test::free_port();  // nothing listens there: rank 1 never finds rank 0
  auto start = Clock::now();
  auto r = test::run_command(rank_cmd(1, 2, port, "--scenario collectives --rendezvous-timeout 3"));
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("comm_worker: rank 1 cannot reach the rendezvous master at 127.0.0.1:" +
                            std::to_string(port) + " (MASTER_ADDR/MASTER_PORT) within 3 s: is rank 0 "
                            "running, and are the address and port right?", 0), 0u) << r.err;
  EXPECT_LT(secs, 15.0);
}

}  // namespace
}  // namespace fsdpx
