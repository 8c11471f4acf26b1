// Hugging Face interop, offline: transformers (in the project's venv) builds small random Llamas
// (2 layers, GQA 4 query / 2 key-value heads, vocab 1000, tied and untied, one file and sharded);
// fsdpx imports them at 1, 2 and 3 ranks and its logits equal transformers' fp32 logits; a run
// trains from one, exports it back and transformers' logits on the result equal fsdpx's own; an
// import exported untrained is bit-identical; a tokenizer made here feeds scripts/tokenize.
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace fsdpx {
namespace {
namespace fs = std::filesystem;
using test::run_command;

std::string python() { return test::venv_python(); }
std::string hf_script(const std::string& name) {
  return python() + " " + (test::source_dir() / "tests" / "hf" / name).string();
}
using fsdpx::test::train;
using fsdpx::test::hf_worker;
using fsdpx::test::ckpt;

// Runs `cmd`, expecting success; returns stdout + stderr.
std::string ok(const std::string& cmd) {
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.out << r.err;
  return r.out + r.err;
}

// Random LlamaForCausalLMs saved by save_pretrained into DIR/name, their reference logits beside
// them; each name may end in ",tied" and ",sharded" (make_llama.py). One python process makes the
// four variants for every test (test::hf_models), since importing transformers is most of its time.
void make_llamas(const fs::path& dir, const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, std::string>> name_variant;
  for (const auto& spec : names) {
    const size_t comma = spec.find(',');
    name_variant.emplace_back(spec.substr(0, comma), comma == std::string::npos ? "" : spec.substr(comma + 1));
  }
  test::hf_models(
      "make_llama.py", {"", "tied", "sharded", "tied,sharded"},
      [](const std::string& variant, const std::string& d) { return variant.empty() ? d : d + "," + variant; }, dir,
      name_variant);
}

// fsdpx's logits at `ranks` ranks against transformers' (`reference`), within `tol`.
void expect_logits(const fs::path& model, const fs::path& reference, int ranks, const std::string& extra = "") {
  const std::string out = model.string() + ".fsdpx" + std::to_string(ranks) + ".safetensors";
  ok(hf_worker() + " --nproc-per-node " + std::to_string(ranks) + " --from-hf " + model.string() + " --ids " +
     reference.string() + " --out " + out + " " + extra);
  const std::string cmp = ok(hf_script("compare_logits.py") + " " + reference.string() + " " + out + " --tol 1e-4");
  std::printf("%s at %d rank(s): %s", model.filename().c_str(), ranks, cmp.c_str());
}

TEST(HfInterop, ImportedLlamaGivesTransformersLogitsAtOneTwoThreeRanks) {
  test::TempDir dir;
  make_llamas(dir.path(), {"untied", "untied_sharded,sharded", "tied,tied", "tied_sharded,tied,sharded"});
  for (bool tied : {false, true}) {
    for (bool sharded : {false, true}) {
      const std::string name = std::string(tied ? "tied" : "untied") + (sharded ? "_sharded" : "");
      const fs::path m = dir.path() / name;
      if (sharded) {
        EXPECT_TRUE(fs::exists(m / "model.safetensors.index.json"));
      }
      for (int ranks : {1, 2, 3}) {
        if (ranks != 2 && (tied || sharded)) continue;  // every layout at 2 ranks; the world sizes on one
        expect_logits(m, dir.path() / (name + ".logits.safetensors"), ranks);
      }
    }
  }
}

// Tokenize with a tokenizer made here, train 5 steps from the Llama, export, load in transformers.
TEST(HfInterop, TrainedWeightsExportedLoadInTransformersWithFsdpxLogits) {
  test::TempDir dir;
  const fs::path d = dir.path();
  make_llamas(d, {"llama"});
  const fs::path m = d / "llama";
  std::string corpus;
  for (int i = 0; i < 60; ++i)
    corpus += "Sample " + std::to_string(i) + ": the sharded model reads its own rows and trains on tokens.\n";
  test::write_file(d / "corpus.txt", corpus);
  ok(hf_script("make_tokenizer.py") + " --corpus " + (d / "corpus.txt").string() + " --out " + (d / "tok").string() +
     " --vocab 300");
  const std::string tok = ok((test::source_dir() / "scripts" / "tokenize").string() + " --tokenizer " +
                             (d / "tok" / "tokenizer.json").string() + " --out " + (d / "corpus.bin").string() + " " +
                             (d / "corpus.txt").string());
  EXPECT_NE(tok.find("(uint16, vocab 300)"), std::string::npos) << tok;
  const std::string run =
      ok("bash -c 'cd " + d.string() + " && " + train() + " --nproc-per-node 2 --model.name gpt " +
         "--model.from_hf llama --data.name tokens --data.path corpus.bin --data.seq 32 --batch-size 2 " +
         "--steps 5 --checkpoint.name consolidated --out run'");
  EXPECT_NE(run.find("initial weights from the Hugging Face checkpoint llama"), std::string::npos) << run;
  const fs::path step = d / "run" / "checkpoints" / "step-00000005";
  ok(ckpt() + " export-hf " + step.string() + " " + (d / "exported").string());
  const nlohmann::json config = nlohmann::json::parse(test::read_file(d / "exported" / "config.json"));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  // transformers' logits on the exported weights = fsdpx's forward on its own checkpoint.
  const fs::path ids = d / "llama.logits.safetensors";
  ok(hf_script("hf_logits.py") + " --model " + (d / "exported").string() + " --ids " + ids.string() + " --out " +
     (d / "hf_trained.safetensors").string());
  ok(hf_worker() + " --nproc-per-node 2 --from-hf " + m.string() + " --init-from " + step.string() + " --ids " +
     ids.string() + " --out " + (d / "fsdpx_trained.safetensors").string());
  const std::string cmp = ok(hf_script("compare_logits.py") + " " + (d / "hf_trained.safetensors").string() + " " +
                             (d / "fsdpx_trained.safetensors").string() + " --tol 1e-4");
  std::printf("trained, exported, loaded by transformers: %s", cmp.c_str());
  // Training moved the weights: the exported logits are not the original ones.
  auto moved = run_command(hf_script("compare_logits.py") + " " + (d / "hf_trained.safetensors").string() + " " +
                           ids.string() + " --tol 1e-3");
  EXPECT_EQ(moved.exit_code, 1) << moved.out << moved.err;
}

TEST(HfInterop, ImportThenExportUntrainedIsBitIdentical) {
  test::TempDir dir;
  const fs::path d = dir.path();
  make_llamas(d, {"untied,sharded", "tied,tied,sharded"});
  for (bool tied : {false, true}) {
    const std::string name = tied ? "tied" : "untied";
    ok("bash -c 'cd " + d.string() + " && " + train() + " --model.name gpt --model.from_hf " + name +
       " --data.name synthetic --data.seq 16 --steps 1 --save-init init_" + name + " --out run_" + name + "'");
    // Shards of at most 200 kB, as the source has: the index is written too.
    const std::string out = ok(ckpt() + " export-hf " + (d / ("init_" + name)).string() + " " +
                               (d / ("back_" + name)).string() + " --max-shard-size 0.0002");
    EXPECT_TRUE(fs::exists(d / ("back_" + name) / "model.safetensors.index.json")) << out;
    const std::string cmp =
        ok(hf_script("compare_tensors.py") + " " + (d / name).string() + " " + (d / ("back_" + name)).string());
    EXPECT_NE(cmp.find(tied ? "20 tensors bit-identical" : "21 tensors bit-identical"), std::string::npos) << cmp;
  }
  // --dtype bf16: the files and config.json say bfloat16, and transformers' logits stay close.
  ok(ckpt() + " export-hf " + (d / "init_untied").string() + " " + (d / "bf16").string() + " --dtype bf16");
  EXPECT_EQ(test::read_json(d / "bf16" / "config.json")["dtype"], "bfloat16");
  ok(hf_script("hf_logits.py") + " --model " + (d / "bf16").string() + " --ids " +
     (d / "untied.logits.safetensors").string() + " --out " + (d / "bf16.logits.safetensors").string());
  std::printf("bf16 export: %s", ok(hf_script("compare_logits.py") + " " + (d / "untied.logits.safetensors").string() +
                                    " " + (d / "bf16.logits.safetensors").string() + " --tol 2e-2")
                                     .c_str());
}

// Each wrong directory is one line naming what is wrong.
TEST(HfInterop, BadDirectoriesAreOneClearLine) {
  test::TempDir dir;
  const fs::path d = dir.path();
  make_llamas(d, {"llama"});
  const fs::path m = d / "llama";
  const std::string base = nlohmann::json::parse(test::read_file(m / "config.json")).dump();
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases{
      {[](nlohmann::json& j) { j["model_type"] = "mistral"; }, "model_type 'mistral' is not a Llama"},
      {[](nlohmann::json& j) {
         j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}};
       },
       "rope_parameters of type 'llama3' is not implemented"},
      {[](nlohmann::json& j) { j["num_hidden_layers"] = 3; },
       "has no tensor 'model.layers.2.input_layernorm.weight' (the model's 'layers.2.attention_norm.weight')"},
      {[](nlohmann::json& j) { j["num_hidden_layers"] = 1; }, "which no parameter of this model takes"},
      {[](nlohmann::json& j) { j["intermediate_size"] = 128; },
       "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [160, 64], the model's 'layers.0.feed_forward.w1' is "
       "[128, 64]"},
      {[](nlohmann::json& j) { j["attention_bias"] = true; },
       "attention_bias is true; gpt's projections have no biases"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = nlohmann::json::parse(base);
    c.edit(j);
    test::write_file(m / "config.json", j.dump());
    auto r = run_command(train() + " --model.name gpt --model.from_hf " + m.string() +
                         " --data.name synthetic --data.seq 16 --steps 1 --out " + (d / "run").string());
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  test::write_file(m / "config.json", base);
  auto r = run_command(train() + " --model.name gpt --model.from_hf " + (d / "nowhere").string() + " --steps 1");
  EXPECT_NE(r.err.find("no config.json there"), std::string::npos) << r.err;
  r = run_command(train() + " --model.name gpt --model.from_hf " + m.string() + " --model.dim 32 --steps 1");
  EXPECT_NE(r.err.find("--model.dim conflicts with --model.from_hf"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace fsdpx
