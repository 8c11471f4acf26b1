// When ranks diverge, fsdpx says who and where: the collective flight recorder and
// --check-collectives, with real processes over Gloo. Faults are injected the way a bug or an
// operator would cause them: a rank that skips one unit's all-gather (FSDPX_FAULT), a rank stopped
// with SIGSTOP, a rank that passes another element count. Every process runs under a hard timeout.
#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "test_paths.h"

namespace fsdpx {
namespace {
using test::read_file;
using test::run_command;
using Clock = std::chrono::steady_clock;

using fsdpx::test::train;
using fsdpx::test::comm_worker;

// gpt tiny at 2 ranks where rank 1 skips the first all-gather of unit layers.0: its collectives
// run one behind from there (Gloo pairs them by order, and layers.1 has the size of layers.0).
// Its output (stdout and stderr) and how long it took.
std::pair<std::string, double> skipping_run(const std::string& dir, const std::string& extra) {
  const auto start = Clock::now();
  auto r = run_command("bash -c 'cd " + dir + " && FSDPX_FAULT=skip-all-gather:1:layers.0 " + train() +
                       " --nproc-per-node 2 --steps 3 --collective-timeout 5 --out out " + extra + " 2>&1'");
  EXPECT_NE(r.exit_code, 0);
  return {r.out + r.err, std::chrono::duration<double>(Clock::now() - start).count()};
}

TEST(FlightRecorder, ARankThatSkipsAnAllGatherIsNamedWithBothCollectives) {
  test::TempDir dir;
  const auto [out, secs] = skipping_run(dir.path().string(), "");
  EXPECT_NE(out.find("rank 1 skips the all-gather of unit layers.0"), std::string::npos) << out;
  // The first divergence, both sides: rank 0 gathered layers.0 where rank 1 gathered layers.1.
  EXPECT_TRUE(
      std::regex_search(out, std::regex("flight records of group 'world': the ranks diverge at #([0-9]+): "
                                        "rank 0 ran all_gather #\\1 \\(unit layers.0, forward, fp32 x 26.7k\\); "
                                        "rank 1 ran all_gather #\\1 \\(unit layers.1, forward, fp32 x 26.7k\\)")))
      << out;
  EXPECT_NE(out.find("Last completed: "), std::string::npos) << out;
  EXPECT_LT(secs, 40.0);  // the 5 s collective timeout, the 2 s diagnosis, the ends
}

TEST(FlightRecorder, CheckCollectivesStopsTheSkippingRankBeforeTheCollectiveRuns) {
  test::TempDir dir;
  const auto [out, secs] = skipping_run(dir.path().string(), "--check-collectives");
  EXPECT_TRUE(
      std::regex_search(out, std::regex("--check-collectives: the ranks of group 'world' \\(ranks 0, 1\\) are about "
                                        "to call different collectives: rank 0 is at all_gather #([0-9]+) \\(unit "
                                        "layers.0, forward, fp32 x 26.7k\\); rank 1 is at all_gather #\\1 \\(unit "
                                        "layers.1, forward, fp32 x 26.7k\\)")))
      << out;
  EXPECT_EQ(out.find("timed out"), std::string::npos) << out;  // found before anything waited
  EXPECT_LT(secs, 30.0);
}

TEST(FlightRecorder, CheckCollectivesCatchesAMismatchedElementCount) {
  auto r = run_command(comm_worker() + " --nproc-per-node 2 --scenario mismatch --fail-rank 1 --check-collectives "
                       "--collective-timeout 20");
  r.out += r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("are about to call different collectives: rank 0 is at all_gather #2 (other, fp32 x 1.0k); "
                       "rank 1 is at all_gather #2 (other, fp32 x 999)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("the all-gather of mismatched sizes ran"), std::string::npos) << r.out;
}

// Rank 1 is stopped mid-run. Rank 0 waits the collective timeout (5 s), then names rank 1 as hung
// with the last collective rank 1 recorded, from the record its heartbeat last published.
TEST(FlightRecorder, AStoppedRankIsNamedAsHungWithItsLastCollective) {
  test::TempDir dir;
  const std::string port = std::to_string(test::free_port());
  const std::string d = dir.path().string();
  auto rank = [&](int r) {
    return "RANK=" + std::to_string(r) + " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(r) +
           " LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " timeout 90 " + train() +
           " --steps 100000 --log-every 20 --collective-timeout 5 --out " + d + "/o" + std::to_string(r);
  };
  const std::string script = "cd " + d + "\n(" + rank(0) + " > r0.out 2> r0.err; echo $? > r0.code) &\n" + rank(1) +
                             " > r1.out 2> r1.err &\n" +
                             "R1=$!\n"
                             "for i in $(seq 300); do grep -q 'step 40/' r0.out 2>/dev/null && break; sleep 0.1; done\n"
                             "pkill -STOP -P $R1; date +%s.%N > stopped\n"  // fsdpx-train, the child of timeout
                             "wait %1; date +%s.%N > ended\n"
                             "pkill -KILL -P $R1; wait\n";
  test::write_file(dir.path() / "run.sh", script);
  run_command("bash " + (dir.path() / "run.sh").string());
  const std::string err0 = read_file(dir.path() / "r0.err");
  EXPECT_NE(std::atoi(read_file(dir.path() / "r0.code").c_str()), 0);
  EXPECT_NE(err0.find("rank 1 is hung (no heartbeat in "), std::string::npos) << err0;
  // Its last collective from its own record, and the one rank 0 waits in. Stopped before it
  // issued that collective, rank 1 "never reached" it; stopped just after (seen once under ASan
  // in CI), its record says it "is at" the same collective as rank 0.
  EXPECT_TRUE(std::regex_search(err0, std::regex("rank 1 (never reached #[0-9]+ \\(last recorded: |is at )"
                                                 "(all_gather|reduce_scatter|all_reduce) #[0-9]+ \\(")))
      << err0;
  EXPECT_TRUE(std::regex_search(err0, std::regex("rank 0 is at [a-z_]+ #[0-9]+ \\("))) << err0;
  // Ranks whose last completed collective is the same are grouped ("ranks 0, 1: ...").
  EXPECT_TRUE(std::regex_search(err0, std::regex("Last completed: (rank 0|ranks 0, 1): [a-z_]+ #[0-9]+ \\("))) << err0;
  const double after = std::stod(read_file(dir.path() / "ended")) - std::stod(read_file(dir.path() / "stopped"));
  std::printf("rank 0 ended %.1f s after rank 1 stopped (collective timeout 5 s)\n", after);
  // Its end, not its diagnosis (which comes at the timeout + 2 s): the failed step then waits out
  // its other collectives in flight (up to 2 here, each up to the timeout; ParamGroup::abandon)
  // and rank 0 keeps the store 3 s for the others. Measured 12-16 s under ctest -j2.
  EXPECT_LT(after, 5.0 + 2.0 + 2 * 5.0 + 3.0 + 1.0);
}

}  // namespace
}  // namespace fsdpx
