// fsdpx::fully_shard's checks across ranks and its per-unit reshard_after_forward, through
// tests/workers/library_worker at 2 CPU ranks (the example's losses are LibraryExample's, in
// tests/library/train_loop_test.py).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "fsdpx/framework/checkpoint/safetensors.h"
#include "test_paths.h"

namespace fsdpx {
namespace {
namespace fs = std::filesystem;

test::CommandResult worker(const std::string& args, int nproc = 2) {
  return test::run_command((test::build_dir() / "tests" / "library_worker").string() + " --nproc-per-node " +
                           std::to_string(nproc) + " " + args);
}

// Rank 0's "step N after forward: gathered G B, kept K B" lines: {G, K} per step.
std::vector<std::pair<int64_t, int64_t>> held_after_forward(const std::string& out) {
  std::vector<std::pair<int64_t, int64_t>> v;
  const std::regex line("after forward: gathered (\\d+) B, kept (\\d+) B");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it)
    v.emplace_back(std::stoll((*it)[1]), std::stoll((*it)[2]));
  return v;
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> v;
  const std::regex line("step (\\d+) loss (\\S+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it)
    v.push_back(std::stod((*it)[2]));
  return v;
}

// "step N mean loss X" lines: the mean over the ranks (the plain loop's: the global batch's).
std::vector<double> mean_losses(const std::string& out) {
  std::vector<double> v;
  const std::regex line("step (\\d+) mean loss (\\S+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it)
    v.push_back(std::stod((*it)[2]));
  return v;
}

// The way FSDP2's users train: torch::optim's SGD (momentum) and AdamW over module->parameters(),
// which after fully_shard are this rank's shards with the reduced gradient rows as .grad, and
// loss.backward() (or ShardedModule::backward): the losses of the plain LibTorch loop on the whole
// global batch within 1e-6 (relative above 1), for the torch::nn Blocks, fsdpx-train's mlp model (with the gradients'
// global norm clipped) and the gpt plugin's tiny (deferred, through the Model overload), at 1, 2
// and 4 CPU ranks and on sim, every strategy (cpu_offload's shards, and so the optimizer's step,
// in host memory on sim), micro-batches with and without gradient sync.
TEST(Library, TorchOptimizersOverTheModulesParametersTrainAsThePlainLoop) {
  struct Case {
    std::string model;  // "", --mlp or --gpt
    std::string optim, extra;
    std::vector<std::pair<std::string, int>> runs;  // fsdpx's arguments, ranks
  };
  const std::string hybrid = "--sharding hybrid_shard --sharding-option shard_size=2";
  const std::vector<Case> cases = {
      {"", "sgd", "", {{"", 1}, {"--loss-backward", 2}, {"", 4}, {"--sharding shard_grad_op --loss-backward", 2},
                       {hybrid + " --loss-backward", 4}, {"--sharding cpu_offload", 2},
                       {"--device sim --loss-backward", 2},
                       {"--device sim --sharding cpu_offload --loss-backward", 2}}},
      {"", "adamw", "--accum 2 --no-sync", {{"--loss-backward", 2}, {"--device sim --sharding cpu_offload", 2}}},
      {"--mlp", "adamw", "--clip 0.5", {{"--loss-backward", 2}, {"--loss-backward", 4}}},
      {"--gpt", "adamw", "", {{"--loss-backward", 2}, {hybrid + " --loss-backward", 4}, {"--device sim", 2}}},
      {"--gpt", "sgd", "--accum 2", {{"--loss-backward", 2}, {"--sharding shard_grad_op --loss-backward", 4}}},
  };
  double worst = 0;
  for (const Case& c : cases) {
    const std::string common = c.model + " --same-batch --torch-optim " + c.optim + " " + c.extra + " ";
    const auto plain = worker("--plain " + common, 1);
    ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
    const std::vector<double> want = mean_losses(plain.out);
    ASSERT_EQ(want.size(), 3u) << plain.out;
    EXPECT_LT(want[2], want[0]) << common << ": the plain loop trains (one batch, three steps)";
    for (const auto& [args, ranks] : c.runs) {
      const std::string what = common + args + " at " + std::to_string(ranks) + " ranks";
      const auto r = worker(common + args, ranks);
      ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.out << r.err;
      const std::vector<double> got = mean_losses(r.out);
      ASSERT_EQ(got.size(), want.size()) << what << "\n" << r.out;
      for (size_t s = 0; s < want.size(); ++s) {
        // 1e-6 relative: float32 rounds a mean loss near gpt's 5.5 to 4.8e-7, and the ranks' means
        // of their parts sum in another order than one mean of the whole batch.
        EXPECT_NEAR(got[s], want[s], 1e-6 * std::max(1.0, std::abs(want[s]))) << what << ", step " << s;
        worst = std::max(worst, std::abs(got[s] - want[s]));
      }
    }
  }
  std::printf("worst |loss - the plain loop's| over every run: %.2e\n", worst);
}

// A checkpoint of torch::optim::AdamW's state (fsdpx-train's mlp model, 2 ranks, after step 2)
// resumes at 1 and 4 ranks as if the run had gone on (steps 2 and 3 within 1e-6), and loads into
// the adamw plugin, whose keys it uses (within 1e-5: the plugin's fused step rounds otherwise);
// an optimizer of a kind fsdpx cannot checkpoint is refused in one line.
TEST(Library, TorchOptimizersStateSavesAndResumesAtAnotherWorldSize) {
  test::TempDir dir;
  const std::string saved = (dir.path() / "step-00000002").string();
  const auto whole = worker("--mlp --torch-optim adamw --steps 4");
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  const std::vector<double> want = mean_losses(whole.out);
  ASSERT_EQ(want.size(), 4u) << whole.out;
  const auto save = worker("--mlp --torch-optim adamw --steps 2 --save-after 2 --save " + saved);
  ASSERT_EQ(save.exit_code, 0) << save.out << save.err;
  const auto verify = test::run_command(test::ckpt() + " verify " + saved);
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  for (const auto& [args, ranks, tolerance] :
       {std::tuple{std::string("--torch-optim adamw"), 1, 1e-6},
        std::tuple{std::string("--torch-optim adamw"), 4, 1e-6}, std::tuple{std::string(""), 2, 1e-5}}) {
    const auto r = worker("--mlp --steps 4 --load " + saved + " " + args, ranks);
    ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.out << r.err;
    const std::vector<double> got = mean_losses(r.out);
    ASSERT_EQ(got.size(), 2u) << r.out;
    for (size_t s = 0; s < 2; ++s)
      EXPECT_NEAR(got[s], want[s + 2], tolerance) << args << " at " << ranks << ", step " << s + 2;
  }
  const auto rmsprop = worker("--mlp --torch-optim rmsprop --steps 1 --save-after 1 --save " +
                              (dir.path() / "rmsprop").string());
  EXPECT_EQ(rmsprop.exit_code, 1) << rmsprop.out << rmsprop.err;
  EXPECT_NE(rmsprop.err.find("library_worker: checkpoint: fsdpx saves the state of torch::optim's SGD, Adam and "
                             "AdamW (as the sgd and adamw plugins'), not of this optimizer"),
            std::string::npos)
      << rmsprop.err;
}

// A writable summon_full_params writes all or nothing, at 2 ranks: a scope that throws writes
// nothing back, a tensor replaced by one of another shape makes commit() refuse in one line and
// write nothing (neither then nor when the object goes), and commit() writes.
TEST(Library, AWritableSummonWritesAllOrNothing) {
  const auto r = worker("--summon-checks");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::smatch m;
  const std::regex line("summon: before (\\S+) after-throw (\\S+) after-refused (\\S+) after-commit (\\S+) up (\\S+)");
  ASSERT_TRUE(std::regex_search(r.out, m, line)) << r.out;
  const double before = std::stod(m[1]), up = std::stod(m[5]);
  EXPECT_EQ(std::stod(m[2]), before);
  EXPECT_EQ(std::stod(m[3]), before);
  EXPECT_NEAR(std::stod(m[4]), before - up, 1e-5);
  EXPECT_NE(r.out.find("refused: summon_full_params: parameter 'block0.up.bias' is now of shape [3], not its [32]; "
                       "nothing was written back (change the values in place, e.g. full[name].copy_(...))"),
            std::string::npos)
      << r.out;
}

// Activation checkpointing and offload through the library on sim (the wrap's
// activation_checkpointing, ShardOptions::activation_offload): every Block's inputs go to host
// memory and back, with the losses of the plain run on the CPU; sim's stream-order check holds the
// copies to the stream protocol.
TEST(Library, RecomputedBlocksOffloadTheirInputsOnSim) {
  const auto plain = worker("");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto offloaded = worker("--device sim --recompute --offload");
  ASSERT_EQ(offloaded.exit_code, 0) << offloaded.out << offloaded.err;
  ASSERT_EQ(losses(plain.out).size(), 3u) << plain.out;
  EXPECT_EQ(losses(offloaded.out), losses(plain.out)) << offloaded.out;
  // A block's input changed in place after its forward, while its copy to host memory may still
  // read it: sim's stream-order check names the race at the write; where no check runs (a GPU),
  // the backward (of block2, the first) finds the changed version and says the copy is not the
  // input. (Without offload, autograd refuses it too.)
  const auto raced = worker("--device sim --recompute --offload --touch-inputs");
  EXPECT_NE(raced.exit_code, 0);
  EXPECT_NE(raced.err.find("sim stream-order hazard"), std::string::npos) << raced.err;
  const auto touched = test::run_command("env FSDPX_SIM_STREAM_CHECK=0 " + (test::build_dir() / "tests" /
                                         "library_worker").string() +
                                         " --nproc-per-node 2 --device sim --recompute --offload --touch-inputs");
  EXPECT_NE(touched.exit_code, 0);
  EXPECT_NE(touched.err.find("unit 'block2': its input was changed in place after its forward, when activation "
                             "offload had copied it to host memory"),
            std::string::npos)
      << touched.err;
}

// Each rank keeps its rows of its own copy: modules built with different seeds are refused on
// every rank, naming the first parameter that differs, before any step.
TEST(Library, RanksWhoseModuleValuesDifferAreRefused) {
  const auto r = worker("--seed-by-rank");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const std::string line =
      "library_worker: fully_shard: the module's values differ between ranks: parameter 'block0.down.bias' of "
      "rank(s) 1 is not rank 0's; each rank keeps its rows of its own copy, so every rank must build the module "
      "with the same values (torch::manual_seed with one seed before building it)";
  size_t seen = 0;
  for (size_t at = r.err.find(line); at != std::string::npos; at = r.err.find(line, at + 1)) ++seen;
  EXPECT_EQ(seen, 2u) << r.err;  // both ranks say it
  EXPECT_EQ(losses(r.out).size(), 0u) << r.out;
}

// reshard_after_forward per unit reaches the engine: the same losses with a unit kept gathered
// (full_shard) or freed (shard_grad_op), and a misspelt unit is one line naming the right one.
// A post-forward group (FSDP2's int reshard_after_forward) at 4 ranks: block1 resharded to pairs
// of ranks holds, from its forward to its backward, half of what it holds kept gathered (and
// nothing gathered), and trains to the same bits; a k that does not divide 4 is one line naming
// the divisors.
// Engine.ReshardAfterForwardPerUnit checks the bytes each choice moves.
TEST(Library, ReshardAfterForwardPerUnit) {
  for (const std::string sharding : {"full_shard", "shard_grad_op"}) {
    const auto plain = worker("--sharding " + sharding);
    ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
    ASSERT_EQ(losses(plain.out).size(), 3u) << plain.out;
    const auto per_unit = worker("--sharding " + sharding + " --reshard block1=" +
                                 (sharding == "full_shard" ? "false" : "true") + " --reshard block2=false");
    ASSERT_EQ(per_unit.exit_code, 0) << per_unit.out << per_unit.err;
    EXPECT_EQ(losses(per_unit.out), losses(plain.out)) << sharding;
  }
  const auto plain4 = worker("", 4), kept4 = worker("--reshard block1=false", 4);
  const auto pairs = worker("--reshard block1=2", 4);
  for (const auto* r : {&plain4, &kept4, &pairs}) ASSERT_EQ(r->exit_code, 0) << r->out << r->err;
  ASSERT_EQ(losses(plain4.out).size(), 3u) << plain4.out;
  EXPECT_EQ(losses(pairs.out), losses(plain4.out));
  const auto kept = held_after_forward(kept4.out), halves = held_after_forward(pairs.out);
  ASSERT_EQ(kept.size(), 3u) << kept4.out;
  ASSERT_EQ(halves.size(), 3u) << pairs.out;
  EXPECT_GT(kept[0].first, 0);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(halves[s].first, 0) << pairs.out;
    EXPECT_EQ(halves[s].second * 2, kept[s].first) << pairs.out << kept4.out;
  }
  const auto bad = worker("--reshard blok1=false");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("library_worker: reshard_after_forward is set for 'blok1', which is not a unit (the units: "
                         "block0, block1, block2); did you mean 'block1'?"),
            std::string::npos)
      << bad.err;
  for (const std::string k : {"3", "0"}) {
    const auto bad_k = worker("--reshard block1=" + k, 4);
    EXPECT_EQ(bad_k.exit_code, 1);
    EXPECT_NE(bad_k.err.find("library_worker: reshard_after_forward for 'block1' is " + k +
                             ", which does not divide the shard group's size 4; give true, false or one of 1, 2, 4"),
              std::string::npos)
        << bad_k.err;
  }
}

// A rank whose int reshard_after_forward makes a group of k that its peers do not make is refused
// on every rank, naming each rank's groups, before any group is made (not a rendezvous that waits
// until it times out); a rank whose bool choice differs is the engine's check, in one line too.
TEST(Library, ReshardAfterForwardThatDiffersBetweenRanksIsRefused) {
  const auto groups = worker("--rank0-reshard block1=2", 4);
  EXPECT_EQ(groups.exit_code, 1) << groups.out << groups.err;
  const std::string line =
      "library_worker: reshard_after_forward differs between ranks: post-forward groups: "
      "no group on rank(s) 1, 2, 3; groups of 2 on rank(s) 0; every rank must give each unit the "
      "same reshard_after_forward";
  size_t seen = 0;
  for (size_t at = groups.err.find(line); at != std::string::npos; at = groups.err.find(line, at + 1)) ++seen;
  EXPECT_EQ(seen, 4u) << groups.err;  // every rank says it
  const auto kept = worker("--rank0-reshard block1=false");
  EXPECT_EQ(kept.exit_code, 1) << kept.out << kept.err;
  EXPECT_NE(kept.err.find("library_worker: the model differs between ranks"), std::string::npos) << kept.err;
  EXPECT_EQ(losses(groups.out).size() + losses(kept.out).size(), 0u);
}

// A checkpoint saved from the library (the parameter names of fsdpx-train's mlp model, AdamW, 2
// ranks, step 3) resumes in fsdpx-train at 3 ranks: it starts at step 3, says that the data starts
// from its beginning (the library's loop had no fsdpx data position), and one step at lr 1e-30
// later its weights are the library's (consolidated both, every tensor within 1e-9).
TEST(Library, ACheckpointOfTheLibraryResumesInFsdpxTrain) {
  test::TempDir dir;
  const fs::path saved = dir.path() / "library" / "step-00000003", out = dir.path() / "train";
  const auto lib = worker("--mlp --save " + saved.string());
  ASSERT_EQ(lib.exit_code, 0) << lib.out << lib.err;
  const auto train = test::run_command(
      test::train() + " --nproc-per-node 3 --model.name mlp --data.name csv " +
      "--data.path " + test::csv_path() + " --wrap.layer_types Hidden --optimizer.name adamw --optimizer.lr 1e-30 " +
      "--checkpoint.name sharded --resume " + saved.string() + " --steps 4 --batch-size 4 --out " + out.string());
  ASSERT_EQ(train.exit_code, 0) << train.out << train.err;
  EXPECT_NE(train.out.find("resumed from " + saved.string() + " at step 3"), std::string::npos) << train.out;
  EXPECT_NE(train.out.find(saved.string() + " holds no data position (a library checkpoint, ShardedModule::save): "
                                            "the data starts from its beginning"),
            std::string::npos)
      << train.out;
  const fs::path a = dir.path() / "library.safetensors", b = dir.path() / "train.safetensors";
  const std::string ckpt = test::ckpt();
  for (const auto& [from, to] : {std::pair{saved, a}, std::pair{out / "checkpoints" / "step-00000004", b}}) {
    const auto c = test::run_command(ckpt + " consolidate " + from.string() + " " + to.string() + " --no-optimizer");
    ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
  }
  SafetensorsReader library(a.string()), trained(b.string());
  ASSERT_EQ(library.entries().size(), 6u);
  ASSERT_EQ(trained.entries().size(), library.entries().size());
  for (const auto& [name, e] : library.entries()) {
    const at::Tensor x = library.read(name), y = trained.read(name);
    EXPECT_TRUE(x.sizes() == y.sizes() && (x - y).abs().max().item<double>() <= 1e-9) << name;
  }
}

// An asynchronous save from the library after step 1, written while steps 2 and 3 change the
// shards, holds step 1's exact state: the same tensors, optimizer state included, to the last bit,
// as a synchronous save of step 1; fsdpx-ckpt verify calls it complete.
TEST(Library, AnAsynchronousSaveHoldsItsStepsState) {
  test::TempDir dir;
  const std::string ckpt = test::ckpt();
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  for (const std::string way : {"sync", "async"}) {
    const fs::path saved = dir.path() / way / "step-00000001", file = dir.path() / (way + ".safetensors");
    const auto r = worker("--mlp --save-after 1 --save " + saved.string() + (way == "async" ? " --async" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto verify = test::run_command(ckpt + " verify " + saved.string());
    EXPECT_EQ(verify.exit_code, 0) << way << ": " << verify.out << verify.err;
    const auto c = test::run_command(ckpt + " consolidate " + saved.string() + " " + file.string());
    ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
    files.push_back(std::make_unique<SafetensorsReader>(file.string()));
  }
  ASSERT_GT(files[0]->entries().size(), 6u);  // the weights and AdamW's state
  ASSERT_EQ(files[1]->entries().size(), files[0]->entries().size());
  for (const auto& [name, e] : files[0]->entries())
    EXPECT_TRUE(files[0]->read(name).equal(files[1]->read(name))) << name;
}

// A Model plugin (gpt tiny, deferred parameters) sharded through fully_shard in a plain loop
// (fsdpx-library-bench) trains as fsdpx-train does with the same seed, data and plugins: the
// same losses to the last bit at 2 ranks (the mean over the ranks, as fsdpx-train logs it).
TEST(Library, AModelPluginTrainsAsFsdpxTrainDoes) {
  test::TempDir dir;
  const std::string common = " --nproc-per-node 2 --steps 4 --batch-size 4 ";
  const auto lib = test::run_command((test::bin_dir() / "fsdpx-library-bench").string() + common +
                                     "--size tiny --seq 64 --out " + (dir.path() / "lib").string());
  ASSERT_EQ(lib.exit_code, 0) << lib.out << lib.err;
  const auto train = test::run_command(
      test::train() + common + "--model.name gpt --model.size tiny --model.seq 64 " +
      "--data.name synthetic --data.seq 64 --wrap.layer_types Block --optimizer.name adamw --log-every 1 " +
      "--checkpoint.name none --out " + (dir.path() / "train").string());
  ASSERT_EQ(train.exit_code, 0) << train.out << train.err;
  std::vector<double> library(4, 0.0), trained;
  for (int r = 0; r < 2; ++r) {
    const std::string text = test::read_file(dir.path() / ("lib.rank" + std::to_string(r)));
    const std::regex loss("\"loss\": ([^,]+),");
    size_t s = 0;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), loss); it != std::sregex_iterator(); ++it, ++s)
      if (s < library.size()) library[s] += std::stod((*it)[1]) / 2;
    ASSERT_EQ(s, 4u) << text;
  }
  const std::string metrics = test::read_file(dir.path() / "train" / "metrics.jsonl");
  const std::regex loss("\"loss\":([^,}]+)");
  for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), loss); it != std::sregex_iterator(); ++it)
    trained.push_back(std::stod((*it)[1]));
  EXPECT_EQ(library, trained);
}

}  // namespace
}  // namespace fsdpx
