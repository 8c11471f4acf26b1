// Two runs on one --out: rank 0 holds a lock on the run directory for the run's life, so
// a second run refuses with one line naming the first run's pid, and a lock left by a dead run
// stops nobody.
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/trainer/run_directory.h"
#include "test_paths.h"

namespace fsdpx {
namespace {
namespace fs = std::filesystem;
using test::run_command;

using fsdpx::test::train;

const std::string kLockRun = " --nproc-per-node 2 --data.name synthetic --data.seq 16 --batch-size 2 ";

TEST(RunLock, ASecondWriterOfADirectoryIsRefusedNamingTheFirst) {
  test::TempDir dir;
  const std::string out = (dir.path() / "run").string();
  {
    RunDirectory first(out, /*writer=*/true);
    first.create("", 1, "{}");
    RunDirectory second(out, /*writer=*/true);
    EXPECT_EQ(test::error_of([&] { second.create("", 1, "{}"); }).rfind(
                  "--out " + out + " is in use by another run (pid " + std::to_string(::getpid()) + " on ", 0),
              0u);
    EXPECT_NE(test::error_of([&] { RunDirectory::check_not_in_use(out); }).find("is in use by another run"),
              std::string::npos);
  }
  // The first is gone, and its lock file with a dead pid in it stops nobody.
  EXPECT_TRUE(fs::exists(fs::path(out) / RunDirectory::kLockFile));
  RunDirectory::check_not_in_use(out);
  RunDirectory third(out, /*writer=*/true);
  third.create("", 1, "{}");
}

// Two real runs: the second, started while the first trains, refuses before any of its workers
// start and leaves the first's files alone; once the first was killed (SIGKILL: it removed
// nothing), a third run takes the directory.
TEST(RunLock, ASecondRunOnARunningRunsDirectoryRefusesNamingItsPid) {
  test::TempDir dir;
  const fs::path out = dir.path() / "run";
  const fs::path lock = out / RunDirectory::kLockFile;
  const std::string script =
      "timeout 50 " + train() + kLockRun + "--steps 100000 --log-every 1 --out " + out.string() + " >" +
      (dir.path() / "first.out").string() + " 2>&1 &\n"
      "first=$!\n"
      "for i in $(seq 200); do grep -q '^pid' " + lock.string() + " 2>/dev/null && break; sleep 0.1; done\n"
      "sleep 1\n"
      "timeout 30 " + train() + kLockRun + "--steps 2 --out " + out.string() +
      " >" + (dir.path() / "second.out").string() + " 2>" + (dir.path() / "second.err").string() + "\n"
      "echo $? >" + (dir.path() / "second.code").string() + "\n"
      "kill -9 $(pgrep -P $first) $first 2>/dev/null; wait\n";
  test::write_file(dir.path() / "run.sh", script);
  run_command("bash " + (dir.path() / "run.sh").string());
  const std::string err = test::read_file(dir.path() / "second.err");
  const std::string holder = test::read_file(lock);
  EXPECT_EQ(test::read_file(dir.path() / "second.code"), "1\n") << err;
  ASSERT_EQ(holder.rfind("pid ", 0), 0u) << holder;
  const std::string pid = holder.substr(0, holder.find(' ', 4));  // "pid 1234"
  EXPECT_NE(err.find("fsdpx-train: --out " + out.string() + " is in use by another run (" + pid + " on "),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("[rank"), std::string::npos) << "the second run started no worker: " << err;
  EXPECT_EQ(test::read_file(dir.path() / "second.out"), "");
  EXPECT_NE(test::read_file(out / "config.ini").find("steps=100000"), std::string::npos);  // still the first's
  // The killed run's lock is no hindrance.
  auto third = run_command(train() + kLockRun + "--steps 2 --out " + out.string());
  EXPECT_EQ(third.exit_code, 0) << third.err;
}

}  // namespace
}  // namespace fsdpx
