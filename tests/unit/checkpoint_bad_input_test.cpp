// Checkpoints as input and as output: a checkpoint missing a part is never taken for a
// complete one (CheckpointCompleteness), and an output never destroys an input, is never written
// through a symlink or onto a device, and leaves no temporary file when it fails (Outputs). Each
// test starts from a real checkpoint of a real 2-rank run.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "test_paths.h"

using namespace fsdpx::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using fsdpx::test::train;
using fsdpx::test::ckpt;

const std::string kBase = " --nproc-per-node 2 --data.name synthetic --data.seq 16 --batch-size 2 --log-every 1 ";
const std::string kShardedRun = kBase + "--checkpoint.name sharded ";

// A run directory with checkpoints at steps 2 and 4, made once per test.
class RunWithCheckpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = run_command(train() + kShardedRun + "--steps 4 --save-every 2 --out " + run().string());
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  fs::path run() const { return dir_.path() / "run"; }
  fs::path step(int n) const { return run() / "checkpoints" / fsdpx::checkpoint_dir_name(n); }
  // A copy of step 4, to damage.
  fs::path copy_of_step4(const std::string& name) const {
    const fs::path c = dir_.path() / name;
    fs::copy(step(4), c, fs::copy_options::recursive);
    return c;
  }
  fs::path dir() const { return dir_.path(); }

 private:
  TempDir dir_;
};

using CheckpointCompleteness = RunWithCheckpoints;
using Outputs = RunWithCheckpoints;

// Every file of the checkpoint, by name, with its bytes.
std::map<std::string, std::string> contents(const fs::path& d) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(d)) out[e.path().filename().string()] = read_file(e.path());
  return out;
}

// The names in `d` holding ".tmp".
std::vector<std::string> temporaries(const fs::path& d) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename().string().find(".tmp") != std::string::npos) out.push_back(e.path().filename().string());
  return out;
}

// verify reads every file the format needs: a missing or garbled trainer state or configuration
// is an error naming the file (verify said OK).
TEST_F(CheckpointCompleteness, VerifyChecksEveryFileTheFormatNeeds) {
  auto ok = run_command(ckpt() + " verify " + step(4).string());
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  struct Damage {
    std::string name, expect;
    std::function<void(const fs::path&)> apply;
  };
  auto set_state = [](const fs::path& c, const std::string& key, const json& value) {
    json s = read_json(c / "trainer_state.json");
    s[key] = value;
    write_file(c / "trainer_state.json", s.dump());
  };
  const std::vector<Damage> damages = {
      {"no-state", "trainer_state.json is missing", [](const fs::path& c) { fs::remove(c / "trainer_state.json"); }},
      {"garbled-data", "trainer_state.json has no data position",
       [&](const fs::path& c) { set_state(c, "data", "x"); }},
      {"other-step", "trainer_state.json records step 3, the checkpoint is of step 4",
       [&](const fs::path& c) { set_state(c, "step", 3); }},
      {"not-json", "trainer_state.json is not valid JSON",
       [](const fs::path& c) { write_file(c / "trainer_state.json", "{\"step\": 4,"); }},
      {"no-config", "config.ini is missing", [](const fs::path& c) { fs::remove(c / "config.ini"); }},
      // Boost's message for this line never finished (fuzz_config found it in --config's reader)
      {"config-not-ini",
       "config.ini does not parse as an INI file (config.ini: the options configuration file contains an invalid "
       "line '%invalid_line%')",
       [](const fs::path& c) { write_file(c / "config.ini", "[model]\n%invalid_line%\n"); }},
      {"no-rank-file", "rank-00001.safetensors is missing",
       [](const fs::path& c) { fs::remove(c / "rank-00001.safetensors"); }},
      // --resume auto skipped such a checkpoint as "rank-00001.safetensors is missing"
      {"rank-file-a-directory", "rank-00001.safetensors is a directory, not a file",
       [](const fs::path& c) {
         fs::remove(c / "rank-00001.safetensors");
         fs::create_directory(c / "rank-00001.safetensors");
       }},
  };
  for (const auto& d : damages) {
    SCOPED_TRACE(d.name);
    const fs::path c = copy_of_step4(d.name);
    d.apply(c);
    auto v = run_command(ckpt() + " verify " + c.string());
    EXPECT_EQ(v.exit_code, 1) << v.out;
    EXPECT_NE(v.err.find(c.string() + " is not complete: " + d.expect), std::string::npos) << v.err;
    EXPECT_EQ(fsdpx::checkpoint_problem(c.string()).rfind(d.expect, 0), 0u) << fsdpx::checkpoint_problem(c.string());
  }
  // A checkpoint moved to another step's name does not pass for that step.
  const fs::path renamed = copy_of_step4("step-00000006");
  EXPECT_EQ(fsdpx::checkpoint_problem(renamed.string()),
            "index.json records step 4, the directory's name step 6");
  // export-hf names the missing config.ini (it said the configuration "records no [model]").
  const fs::path no_config = copy_of_step4("export-without-config");
  fs::remove(no_config / "config.ini");
  auto hf = run_command(ckpt() + " export-hf " + no_config.string() + " " + (dir() / "hf-out").string());
  EXPECT_EQ(hf.exit_code, 1) << hf.out;
  EXPECT_NE(hf.err.find(no_config.string() + " has no config.ini; export-hf needs it for the model that saved"),
            std::string::npos)
      << hf.err;
  EXPECT_FALSE(fs::exists(dir() / "hf-out"));
}

// --resume auto takes the newest complete checkpoint and names each newer one it skips, with why
// (a newest checkpoint without its trainer state "resumed" and lost the data position; one
// without index.json was skipped without a word).
TEST_F(CheckpointCompleteness, ResumeAutoNamesEachNewerCheckpointItSkips) {
  fs::remove(step(4) / "trainer_state.json");
  fs::create_directories(step(6));
  for (const auto& e : fs::directory_iterator(step(2)))
    if (e.path().filename() != "index.json") fs::copy(e.path(), step(6) / e.path().filename());
  EXPECT_EQ(fsdpx::skipped_checkpoints((run() / "checkpoints").string()),
            (std::vector<std::string>{step(6).string() + ": index.json is missing",
                                      step(4).string() + ": trainer_state.json is missing"}));
  auto r = run_command(train() + kShardedRun + "--steps 8 --resume auto --out " + run().string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("resumed from " + step(2).string() + " at step 2"), std::string::npos) << r.out;
  for (const std::string& skipped : {step(6).string() + ": index.json is missing",
                                    step(4).string() + ": trainer_state.json is missing"})
    EXPECT_NE(r.err.find("--resume auto skips " + skipped), std::string::npos) << r.err;
}

// A checkpoint named with --resume DIR must be complete too.
TEST_F(CheckpointCompleteness, ResumingFromAnIncompleteCheckpointIsRefused) {
  write_file(step(4) / "trainer_state.json", json{{"step", 4}, {"seed", 0}}.dump());
  auto r = run_command(train() + kShardedRun + "--steps 6 --resume " + step(4).string() + " --out " +
                       (dir() / "next").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("checkpoint " + step(4).string() + " is not complete: trainer_state.json has no data position"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("resumed"), std::string::npos) << r.out;
}

// A checkpoint whose tensor is held under an older name (gpt's "tok_embeddings" before it became
// a module's "tok_embeddings.weight") is refused naming both.
TEST_F(CheckpointCompleteness, ATensorHeldUnderAnOlderNameIsNamed) {
  json index = json::parse(read_file(step(4) / "index.json"));
  json& tensors = index["tensors"];
  ASSERT_TRUE(tensors.contains("tok_embeddings.weight")) << tensors.dump();
  tensors["tok_embeddings"] = tensors["tok_embeddings.weight"];
  tensors.erase("tok_embeddings.weight");
  write_file(step(4) / "index.json", index.dump());
  auto r = run_command(train() + kShardedRun + "--steps 6 --resume " + step(4).string() + " --out " +
                       (dir() / "next").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("checkpoint " + step(4).string() + " has no tensor 'tok_embeddings.weight' but holds "
                       "'tok_embeddings': was it saved by an older version of the model, or saved from another "
                       "model, optimizer or precision?"),
            std::string::npos)
      << r.err;
}

// consolidate into its own checkpoint (onto a rank file, the index, the directory, or a new file
// in it) is refused, and the checkpoint stays as it was (it exited 0 and corrupted it).
TEST_F(Outputs, ConsolidateNeverWritesInsideItsCheckpoint) {
  const auto before = contents(step(4));
  for (const std::string name : {"rank-00000.safetensors", "index.json", "", "new.safetensors"}) {
    SCOPED_TRACE(name);
    const fs::path out = name.empty() ? step(4) : step(4) / name;
    auto r = run_command(ckpt() + " consolidate " + step(4).string() + " " + out.string());
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.err.find("the output " + out.string() + (name.empty() ? " is" : " lies inside") + " the checkpoint " +
                         step(4).string() + ", which it reads; write it elsewhere"),
              std::string::npos)
        << r.err;
  }
  EXPECT_EQ(contents(step(4)), before);
  EXPECT_EQ(run_command(ckpt() + " verify " + step(4).string()).exit_code, 0);
  auto hf = run_command(ckpt() + " export-hf " + step(4).string() + " " + (step(4) / "hf").string());
  EXPECT_EQ(hf.exit_code, 1);
  EXPECT_NE(hf.err.find("lies inside the checkpoint"), std::string::npos) << hf.err;
  EXPECT_FALSE(fs::exists(step(4) / "hf"));
}

// A symlink or a FIFO named as the output is refused and stays what it was (both were replaced by
// a regular file); an existing directory is refused, leaving no temporary file (a full-size .tmp
// stayed behind).
TEST_F(Outputs, NonRegularTargetsAreRefusedAndNothingIsLeftBehind) {
  const fs::path outs = dir() / "outs";
  fs::create_directories(outs / "a-directory");
  write_file(dir() / "precious.txt", "keep me\n");
  fs::create_symlink(dir() / "precious.txt", outs / "link.safetensors");
  ASSERT_EQ(::mkfifo((outs / "fifo.safetensors").c_str(), 0600), 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"link.safetensors", "is a symlink"}, {"fifo.safetensors", "is a FIFO"}, {"a-directory", "is a directory"}};
  for (const auto& [name, expect] : cases) {
    SCOPED_TRACE(name);
    auto r = run_command("timeout 30 " + ckpt() + " consolidate " + step(4).string() + " " + (outs / name).string());
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.err.find("the output " + (outs / name).string() + " " + expect), std::string::npos) << r.err;
    EXPECT_TRUE(temporaries(outs).empty()) << temporaries(outs).front();
  }
  EXPECT_TRUE(fs::is_symlink(outs / "link.safetensors"));
  EXPECT_EQ(read_file(dir() / "precious.txt"), "keep me\n");
  EXPECT_TRUE(fs::is_fifo(outs / "fifo.safetensors"));
  auto hf = run_command(ckpt() + " export-hf " + step(4).string() + " " + (outs / "link.safetensors").string());
  EXPECT_EQ(hf.exit_code, 1);
  EXPECT_NE(hf.err.find("exists and is a symlink"), std::string::npos) << hf.err;
  // A good output still works, and a failing one (a corrupted checkpoint) leaves nothing.
  const fs::path good = outs / "model.safetensors";
  EXPECT_EQ(run_command(ckpt() + " consolidate " + step(4).string() + " " + good.string()).exit_code, 0);
  const fs::path bad = copy_of_step4("corrupted");
  {
    std::fstream f(bad / "rank-00001.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  auto r = run_command(ckpt() + " consolidate " + bad.string() + " " + (outs / "bad.safetensors").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(fs::exists(outs / "bad.safetensors"));
  EXPECT_TRUE(temporaries(outs).empty());
}

// A run's outputs never lie inside what it reads: --out inside the checkpoint it resumes from,
// --save-init holding --init-from (the save replaces its whole directory).
TEST_F(Outputs, ARunsOutputsStayOutOfItsInputs) {
  auto r = run_command(train() + kShardedRun + "--steps 6 --resume " + step(4).string() + " --out " +
                       (step(4) / "run").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--out " + (step(4) / "run").string() + " lies inside --resume " + step(4).string()),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(step(4) / "run"));
  const fs::path init = dir() / "init";
  ASSERT_EQ(run_command(train() + kBase + "--steps 1 --save-init " + init.string()).exit_code, 0);
  const std::string digests = read_file(init / "digests.json");
  r = run_command(train() + kBase + "--steps 1 --init-from " + (init / "model.safetensors").string() +
                  " --save-init " + init.string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--save-init " + init.string() + " holds --init-from"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(init / "digests.json"), digests);
}

}  // namespace
