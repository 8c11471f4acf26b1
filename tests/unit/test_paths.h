// Paths and helpers shared by the tests. Locations derive from the build directory, which CMake
// writes into test_config.h.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdpx::test {

std::filesystem::path build_dir();    // the CMake build directory
std::filesystem::path source_dir();   // the checkout (scripts, tests/hf)
std::string venv_python();            // the python whose torch fsdpx was built with
std::filesystem::path fixture_dir();  // built fixture plugins
std::filesystem::path plugin_dir();   // build/lib/fsdpx/plugins
std::filesystem::path bin_dir();      // build/bin
std::filesystem::path fixture(const std::string& name);  // fixture_dir()/fixture_<name>.so
// The programs the tests run, as command-line words: build/bin/fsdpx-train and fsdpx-ckpt;
// the workers in build/tests.
std::string train();
std::string ckpt();
std::string engine_worker();
std::string comm_worker();
std::string hf_worker();
std::string csv_path();  // scikit-learn's breast_cancer.csv in the venv (scripts/setup.sh installs it)
// fsdpx-train flags for a run on the text data (the default) whose test checks neither held-out
// evaluation nor MFU: no held-out share (the default 2% at --data.seq 32 is 1,610 samples, which
// took half of a 2-rank, 5-step run's CPU time) and no matmul probe for the peak. Evaluation is
// checked in deterministic_test (bits at every layout), device_train_test (sim against the CPU),
// t5_test, t5_hf_test and trainer_test (csv); the probe in device_train_test.
inline const std::string kNoEval = " --data.holdout 0 --peak-tflops 1 ";

// Small random Hugging Face models that a tests/hf script makes (make_llama.py, make_t5.py), copied
// to dir/name with their reference logits beside them (dir/name.logits.safetensors). `arg` writes
// the script's argument for one variant and directory. The first test that asks makes every variant
// of `all_variants` in one python process (importing transformers costs about 7 CPU-s) under a lock,
// in build/tests/hf_models; the others copy them. The script seeds its models, so a copy holds the
// bits a fresh run writes. The key is the script's text, its arguments and the versions of the
// packages that write the files; a new key replaces the models of the old one.
void hf_models(const std::string& script, const std::vector<std::string>& all_variants,
               const std::function<std::string(const std::string& variant, const std::string& dir)>& arg,
               const std::filesystem::path& dir, const std::vector<std::pair<std::string, std::string>>& name_variant);

// A fresh private (0700) directory, removed when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

void write_file(const std::filesystem::path& p, const std::string& text);
// The whole file ("" if it cannot be read).
std::string read_file(const std::filesystem::path& p);

// How many times `what` occurs in `text` (overlapping occurrences counted).
int count_of(const std::string& text, const std::string& what);

// The message of the fsdpx::Error that `f` throws, or "(no error)".
std::string error_of(const std::function<void()>& f);
// The message of the c10::Error (LibTorch's) that `f` throws, without its backtrace, or "(no error)".
std::string torch_error_of(const std::function<void()>& f);

// JSON files a run writes: one document; one document per line (metrics.jsonl); the lines of a
// run directory's metrics.jsonl that report a step (they have a loss; evaluations are left out);
// each tensor's digest in a sharded checkpoint's index.json (optimizer state included or not).
// Throws on a file that cannot be read or parsed.
nlohmann::json read_json(const std::filesystem::path& p);
std::vector<nlohmann::json> read_json_lines(const std::filesystem::path& p);
std::vector<nlohmann::json> step_metrics(const std::filesystem::path& run_dir);
std::map<std::string, std::string> tensor_digests(const std::filesystem::path& checkpoint, bool with_optimizer = true);

// Runs a command through the shell, stopped after `timeout_s` seconds (exit code 124); captures
// stdout and stderr (merged unless split). The limit is there so that nothing hangs; it is three
// minutes because make test runs three tests at once on two cores, heaviest first (a run that
// takes 25 s alone has taken over a minute beside the slurm and SDK tests).
struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
CommandResult run_command(const std::string& command, int timeout_s = 180);

// Whether this test binary runs under AddressSanitizer (make test-sanitize): a few heavy cases,
// whose code the lighter ones cover, are skipped there for the CI's time.
bool under_sanitizers();

// A loopback port nothing listens on now, outside the ephemeral range (pick_rendezvous_port).
int free_port();

}  // namespace fsdpx::test
