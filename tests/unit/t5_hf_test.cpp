// Hugging Face interop for t5, offline: transformers (in the project's venv) builds small random
// T5ForConditionalGenerations, v1.0 (ReLU, tied and scaled lm_head) and v1.1 (gated GELU, untied),
// with 2 encoder and 3 decoder blocks and 8 relative position buckets up to distance 12 (so that
// the log-spaced and clamped buckets are reached), on sources padded to different lengths. fsdpx
// imports them at 1, 2 and 3 ranks and its logits equal transformers' fp32 logits; a run trains
// from one, exports it, and transformers' logits on the result equal fsdpx's own; an import
// exported untrained is bit-identical; fsdpx's exact match equals transformers' greedy decoding.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "test_paths.h"

namespace fsdpx {
namespace {
namespace fs = std::filesystem;
using test::run_command;

std::string hf_script(const std::string& name) {
  return test::venv_python() + " " + (test::source_dir() / "tests" / "hf" / name).string();
}
using fsdpx::test::train;
using fsdpx::test::hf_worker;
using fsdpx::test::ckpt;

std::string ok(const std::string& cmd) {
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.out << r.err;
  return r.out + r.err;
}

// Random T5ForConditionalGenerations (variant "v1.0", "v1.1", "v1.1-sharded", ...) saved into
// DIR/name, their reference logits beside them; one python process makes the four variants for
// every test (test::hf_models), since importing transformers is most of its time.
void make_t5(const fs::path& dir, const std::vector<std::pair<std::string, std::string>>& name_variant) {
  test::hf_models(
      "make_t5.py", {"v1.0", "v1.1", "v1.0-sharded", "v1.1-sharded"},
      [](const std::string& variant, const std::string& d) { return variant + "=" + d; }, dir, name_variant);
}

fs::path reference(const fs::path& model) { return model.string() + ".logits.safetensors"; }

// fsdpx's logits (hf_worker, `init` an fsdpx checkpoint or none) against `expected`, within 1e-4.
void expect_logits(const fs::path& model, const fs::path& expected, int ranks, const std::string& init = "") {
  const std::string out = model.string() + ".fsdpx" + std::to_string(ranks) + ".safetensors";
  ok(hf_worker() + " --nproc-per-node " + std::to_string(ranks) + " --model t5 --from-hf " + model.string() +
     " --ids " + reference(model).string() + " --out " + out + (init.empty() ? "" : " --init-from " + init));
  const std::string cmp = ok(hf_script("compare_logits.py") + " " + expected.string() + " " + out + " --tol 1e-4");
  std::printf("%s at %d rank(s): %s", model.filename().c_str(), ranks, cmp.c_str());
}

// Pairs of a task a tiny T5 half learns in a few seconds: the last and the first of 1 to 5 words.
fs::path write_pairs(const fs::path& dir) {
  const std::vector<std::string> words{"cat", "dog", "owl", "bee", "ant", "fox", "elk", "yak"};
  std::string text;
  uint64_t x = 99;
  auto next = [&x](uint64_t n) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (x >> 33) % n;
  };
  for (int i = 0; i < 400; ++i) {
    std::vector<std::string> w(1 + next(5));
    std::string source;
    for (auto& s : w) source += (source.empty() ? "" : " ") + (s = words[next(words.size())]);
    text += nlohmann::json{{"source", source}, {"target", w.back() + " " + w.front()}}.dump() + "\n";
  }
  test::write_file(dir / "pairs.jsonl", text);
  return dir / "pairs.jsonl";
}

const char* const kData = " --data.name seq2seq --data.source_len 24 --data.target_len 10 --wrap.layer_types T5Block";

// Both variants in each test: the models come from one python process (importing transformers
// costs more than the fsdpx runs that follow).
TEST(T5HfInterop, ImportedT5GivesTransformersLogitsAtOneTwoThreeRanks) {
  test::TempDir dir;
  const fs::path d = dir.path(), sharded = d / "v1.1_sharded";
  make_t5(d, {{"v1.0", "v1.0"}, {"v1.1", "v1.1"}, {"v1.1_sharded", "v1.1-sharded"}});
  for (const std::string variant : {"v1.0", "v1.1"})
    for (int ranks : {1, 2, 3}) expect_logits(d / variant, reference(d / variant), ranks);
  EXPECT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
  expect_logits(sharded, reference(sharded), 2);
}

// Train 5 steps from each variant at 2 ranks and export it (the checkpoint and the directory
// written). Returns the checkpoint.
fs::path train_and_export(const fs::path& d, const std::string& variant, const fs::path& pairs) {
  const fs::path m = d / variant, run_dir = d / ("run_" + variant), exported = d / ("exported_" + variant);
  const std::string run = ok(train() + " --nproc-per-node 2 --model.name t5 --model.from_hf " + m.string() + kData +
                             " --data.path " + pairs.string() + " --batch-size 4 --steps 5 --optimizer.lr 1e-2" +
                             " --checkpoint.name consolidated --out " + run_dir.string());
  EXPECT_NE(run.find("initial weights from the Hugging Face checkpoint"), std::string::npos) << run;
  const fs::path step = run_dir / "checkpoints" / "step-00000005";
  ok(ckpt() + " export-hf " + step.string() + " " + exported.string());
  const nlohmann::json config = test::read_json(exported / "config.json");
  EXPECT_EQ(config["model_type"], "t5");
  EXPECT_EQ(config["num_decoder_layers"], 3);
  EXPECT_EQ(config["feed_forward_proj"], variant == "v1.0" ? "relu" : "gated-gelu");
  return step;
}

// ... then load each export in transformers: fsdpx's logits on its checkpoint.
TEST(T5HfInterop, TrainedWeightsExportedLoadInTransformersWithFsdpxLogits) {
  test::TempDir dir;
  const fs::path d = dir.path(), pairs = write_pairs(d);
  make_t5(d, {{"v1.0", "v1.0"}, {"v1.1", "v1.1"}});
  std::string logits = hf_script("hf_logits.py");
  std::map<std::string, fs::path> steps;
  for (const std::string variant : {"v1.0", "v1.1"}) {
    steps[variant] = train_and_export(d, variant, pairs);
    logits += " --model " + (d / ("exported_" + variant)).string() + " --ids " + reference(d / variant).string() +
              " --out " + (d / ("hf_trained_" + variant + ".safetensors")).string();
  }
  ok(logits);
  for (const std::string variant : {"v1.0", "v1.1"}) {
    const fs::path m = d / variant, hf_trained = d / ("hf_trained_" + variant + ".safetensors");
    expect_logits(m, hf_trained, 2, steps[variant].string());
    // Training moved the weights: the exported logits are not the original ones.
    auto moved = run_command(hf_script("compare_logits.py") + " " + hf_trained.string() + " " +
                             reference(m).string() + " --tol 1e-3");
    EXPECT_EQ(moved.exit_code, 1) << moved.out << moved.err;
  }
}

TEST(T5HfInterop, ImportThenExportUntrainedIsBitIdentical) {
  test::TempDir dir;
  const fs::path d = dir.path();
  make_t5(d, {{"v1.0", "v1.0-sharded"}, {"v1.1", "v1.1-sharded"}});
  for (const std::string variant : {"v1.0", "v1.1"}) {
    ok("bash -c 'cd " + d.string() + " && " + train() + " --model.name t5 --model.from_hf " + variant +
       " --data.name synthetic --data.seq 8 --wrap.layer_types T5Block --steps 1 --save-init init_" + variant +
       " --out run_" + variant + "'");
    ok(ckpt() + " export-hf " + (d / ("init_" + variant)).string() + " " + (d / ("back_" + variant)).string() +
       " --max-shard-size 0.0002");
    const std::string cmp =
        ok(hf_script("compare_tensors.py") + " " + (d / variant).string() + " " + (d / ("back_" + variant)).string());
    // 2 + 3 blocks, the two bias tables, the final norms, shared (and v1.1's lm_head and wi_1s).
    EXPECT_NE(cmp.find(variant == "v1.0" ? "60 tensors bit-identical" : "66 tensors bit-identical"), std::string::npos)
        << cmp;
  }
}

// fsdpx's held-out exact match (one teacher-forced forward) is the accuracy of transformers'
// greedy decoding (generate, with its KV cache) on the same pairs with the same weights.
TEST(T5HfInterop, ExactMatchIsTransformersGreedyDecodingAccuracy) {
  test::TempDir dir;
  const fs::path d = dir.path(), pairs = write_pairs(d);
  ok(train() + " --nproc-per-node 2 --model.name t5" + kData + " --data.path " + pairs.string() +
     " --data.holdout 0.2 --batch-size 8 --steps 150 --eval-every 150 --log-every 150 --optimizer.lr 3e-3" +
     " --checkpoint.name consolidated --out " + (d / "run").string());
  double accuracy = -1;
  for (const auto& m : test::read_json_lines(d / "run" / "metrics.jsonl"))
    if (m.contains("eval_accuracy")) accuracy = m["eval_accuracy"].get<double>();
  ok(ckpt() + " export-hf " + (d / "run" / "checkpoints" / "step-00000150").string() + " " + (d / "hf").string());
  const std::string out = ok(hf_script("t5_exact_match.py") + " --model " + (d / "hf").string() + " --pairs " +
                             pairs.string() + " --source-len 24 --target-len 10 --holdout 0.2");
  std::printf("fsdpx exact match %.4f; transformers' greedy decoding: %s", accuracy, out.c_str());
  const auto at = out.find("exact match ");
  ASSERT_NE(at, std::string::npos) << out;
  const int correct = std::stoi(out.substr(at + 12));
  EXPECT_EQ(out.substr(out.find('/', at) + 1, 2), "80");
  EXPECT_NEAR(accuracy, correct / 80.0, 1e-9);
  EXPECT_GT(correct, 0);  // a comparison of something: the model learned part of the task
  EXPECT_LT(correct, 80);
}

// Each wrong directory is one line naming what is wrong. The directory edited is fsdpx's own
// export of a v1.0 of make_t5.py's sizes (the other tests show transformers reads those).
TEST(T5HfInterop, BadDirectoriesAreOneClearLine) {
  test::TempDir dir;
  const fs::path d = dir.path(), m = d / "t5";
  ok(train() + " --model.name t5 --model.dim 64 --model.head_dim 16 --model.ffn_hidden 96 --model.layers 2" +
     " --model.decoder_layers 3 --model.heads 4 --model.vocab 384 --data.name synthetic --data.seq 8" +
     " --wrap.layer_types T5Block --steps 1 --save-init " + (d / "init").string() + " --out " + (d / "r").string());
  ok(ckpt() + " export-hf " + (d / "init").string() + " " + m.string());
  const std::string base = test::read_file(m / "config.json");
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases{
      {[](nlohmann::json& j) {
         j["model_type"] = "llama";
         j["architectures"] = {"LlamaForCausalLM"};
       },
       "describes a LlamaForCausalLM (model_type 'llama'), not a T5ForConditionalGeneration"},
      {[](nlohmann::json& j) { j["architectures"] = {"T5EncoderModel"}; },
       "describes a T5EncoderModel (model_type 't5'), not a T5ForConditionalGeneration"},
      {[](nlohmann::json& j) { j["feed_forward_proj"] = "gated-silu"; },
       "feed_forward_proj 'gated-silu' is not implemented; t5 has 'relu' (v1.0) and 'gated-gelu' (v1.1, flan)"},
      {[](nlohmann::json& j) { j["num_layers"] = 3; },
       "has no tensor 'encoder.block.2.layer.0.layer_norm.weight' (the model's "
       "'encoder.block.2.self_attention_norm.weight')"},
      {[](nlohmann::json& j) { j["d_ff"] = 128; },
       "tensor 'encoder.block.0.layer.1.DenseReluDense.wi.weight' has shape [96, 64], the model's "
       "'encoder.block.0.feed_forward.wi' is [128, 64]"},
      {[](nlohmann::json& j) { j["pad_token_id"] = 5; }, "pad_token_id is 5; t5 pads and starts the decoder with id 0"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = nlohmann::json::parse(base);
    c.edit(j);
    test::write_file(m / "config.json", j.dump());
    auto r = run_command(train() + " --model.name t5 --model.from_hf " + m.string() +
                         " --data.name synthetic --data.seq 8 --wrap.layer_types T5Block --steps 1 --out " +
                         (d / "run").string());
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  test::write_file(m / "config.json", base);
  auto r = run_command(train() + " --model.name t5 --model.from_hf " + m.string() + " --model.dim 32 --steps 1");
  EXPECT_NE(r.err.find("--model.dim conflicts with --model.from_hf"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace fsdpx
