// Bad input to fsdpx-train, fsdpx-plugins and the option parser, one class of defect per suite:
// paths used without checking what they are (InputPaths), options accepted without
// effect (OptionEffects), flags that cannot go together (FlagConflicts), and messages (Messages).
// Every case runs the real programs on real files, through test::run_command (a 180 s timeout).
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "fsdpx/error.h"
#include "fsdpx/files.h"
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/trainer/train_command.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/interfaces.h"
#include "test_paths.h"

namespace fsdpx {
namespace {
namespace fs = std::filesystem;
using test::run_command;

using fsdpx::test::train;
std::string plugins_tool() { return (test::bin_dir() / "fsdpx-plugins").string(); }

// A quick run's configuration: small data, one step.
const std::string kQuick = " --data.name synthetic --data.seq 16 --batch-size 2 --steps 1 ";

int lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n + (!text.empty() && text.back() != '\n');
}

// One line on stderr, starting with the program's name, holding `want`; a non-zero status.
void expect_one_line(const test::CommandResult& r, const std::string& program, const std::string& want) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.rfind(program + ": ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
}

// A copy of a real plugin cut after its first 4 KiB, as a copy that ran out of space leaves it.
fs::path truncated_plugin(const fs::path& dir) {
  const fs::path p = dir / "wrap_cut.so";
  fs::copy_file(test::plugin_dir() / "wrap_size_based.so", p);
  fs::resize_file(p, 4096);
  return p;
}

// --- File inputs: each is checked for its kind before use -------------------------------------

TEST(InputPaths, ADirectoryGivenAsConfigIsRefused) {
  test::TempDir dir;
  EXPECT_EQ(test::error_of([&] { read_config_file(dir.path()); }),
            "config file " + dir.path().string() +
                " is a directory (--config); give an INI file, such as a run directory's config.ini");
  auto r = run_command(train() + " --config " + dir.path().string() + " --dry-run");
  expect_one_line(r, "fsdpx-train", "is a directory (--config)");
}

// A loop of symbolic links was "unreadable, not a regular file" as --config and "does not exist"
// as a text data path; each is now named as the loop it is.
TEST(InputPaths, ASymbolicLinkLoopIsNamedAsALoop) {
  test::TempDir dir;
  const fs::path a = dir.path() / "a", b = dir.path() / "b";
  fs::create_symlink(b, a);
  fs::create_symlink(a, b);
  const std::string loop = "is a loop of symbolic links (following them never reaches a file)";
  auto r = run_command(train() + " --config " + a.string() + " --dry-run");
  expect_one_line(r, "fsdpx-train", "config file " + a.string() + " " + loop + " (--config)");
  for (const std::string data : {"text", "tokens", "csv --model.name mlp", "seq2seq --model.name t5"}) {
    SCOPED_TRACE(data);
    r = run_command(train() + " --data.name " + data + " --data.path " + a.string() + " --dry-run");
    expect_one_line(r, "fsdpx-train", "data.path " + a.string() + " " + loop + "; point data.path at a file");
  }
  EXPECT_EQ(file_kind(a.string()), kSymlinkLoop);
}

TEST(InputPaths, DataPathsThatAreNotRegularFilesAreRefused) {
  test::TempDir dir;
  const fs::path fifo = dir.path() / "corpus.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // A FIFO nobody writes to would block the run for ever (timeout 20 ends it on a build that reads it).
  auto r = run_command("timeout 20 " + train() + " --data.path " + fifo.string() + " --dry-run");
  expect_one_line(r, "fsdpx-train", "data.path " + fifo.string() + " is a FIFO, not a regular file");
  r = run_command(train() + " --data.name tokens --data.path /dev/zero --dry-run");
  expect_one_line(r, "fsdpx-train", "data.path /dev/zero is a character device, not a regular file");
  r = run_command(train() + " --model.name mlp --data.name csv --data.path " + dir.path().string() + " --dry-run");
  expect_one_line(r, "fsdpx-train", "data.path " + dir.path().string() + " is a directory; give a file");
  EXPECT_EQ(test::error_of([] { check_input_file("/dev/zero", "--x"); }),
            "--x /dev/zero is a character device, not a regular file");
  // A regular file larger than the memory a source would hold it in is refused up front.
  const std::string huge = test::error_of([] { check_fits_in_memory(uint64_t{1} << 60, "text data x", "use less"); });
  EXPECT_EQ(huge.rfind("text data x needs 1073741824.0 GiB of memory, and this machine has ", 0), 0u) << huge;
  EXPECT_EQ(test::error_of([] { check_fits_in_memory(1, "text data x", "use less"); }), "(no error)");
}

// A plugin cut short is refused before dlopen maps it (which ended both programs with SIGBUS,
// exit 135 and nothing printed, when they merely scanned its folder), with one line naming it.
// Both hosts give the same verdict (fsdpx-plugins exited 1 while fsdpx-train warned and went on):
// an error, or with --skip-broken-plugins a warning.
TEST(InputPaths, ATruncatedPluginInAScannedFolderIsRefusedWithOneLine) {
  test::TempDir dir;
  const fs::path cut = truncated_plugin(dir.path());
  const std::string cut_short =
      "cannot load plugin " + cut.string() + ": the file is cut short (4096 bytes, but its ELF ";
  auto list = run_command(plugins_tool() + " --plugin-dir " + dir.path().string() + " list");
  EXPECT_EQ(list.exit_code, 1) << list.err;
  EXPECT_NE(list.out.find("size_based"), std::string::npos) << "the other plugins are still listed";
  EXPECT_NE(list.err.find("fsdpx-plugins: " + cut_short), std::string::npos) << list.err;
  EXPECT_NE(list.err.find("(remove it, or pass --skip-broken-plugins to go on without it)"), std::string::npos);
  EXPECT_EQ(lines(list.err), 1) << list.err;
  const std::string env = "env FSDPX_PLUGIN_PATH=" + dir.path().string() + " ";
  auto run = run_command(env + train() + kQuick + " --dry-run");
  expect_one_line(run, "fsdpx-train", cut_short);
  // The way past it, the same in both hosts: a warning, and the run goes on.
  run = run_command(env + train() + kQuick + " --dry-run --skip-broken-plugins");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("fsdpx-train: warning: " + cut_short), std::string::npos) << run.err;
  list = run_command(env + plugins_tool() + " --skip-broken-plugins list");
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_NE(list.err.find("fsdpx-plugins: warning: " + cut_short), std::string::npos) << list.err;
  PluginHost host;
  EXPECT_NE(test::error_of([&] { host.load_file(cut); }).find("the file is cut short"), std::string::npos);
}

// A plugin built for another processor is named as such (the loader said "No such file or
// directory" or "wrong ELF class"): here a real plugin whose ELF header says AArch64, and one that
// says 32-bit.
TEST(InputPaths, APluginForAnotherMachineIsNamedAsSuch) {
  test::TempDir dir;
  auto patched = [&](const std::string& name, std::streamoff at, const std::string& bytes) {
    const fs::path p = dir.path() / name;
    fs::copy_file(test::plugin_dir() / "wrap_size_based.so", p);
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(at).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  };
  const fs::path arm = patched("arm.so", 18, std::string("\xb7\x00", 2));  // e_machine = EM_AARCH64 (183)
  const fs::path narrow = patched("narrow.so", 4, std::string("\x01", 1));  // EI_CLASS = ELFCLASS32
  PluginHost host;
  EXPECT_EQ(test::error_of([&] { host.load_file(arm); }),
            "cannot load plugin " + arm.string() + ": it is built for AArch64, and this machine runs x86-64 (64-bit); "
            "build the plugin for this machine (fsdpx_add_plugin in its CMake project)");
  EXPECT_NE(test::error_of([&] { host.load_file(narrow); }).find(": it is built for 32-bit x86-64, and this machine "),
            std::string::npos);
  auto r = run_command(train() + kQuick + "--plugin " + arm.string() + " --dry-run");
  expect_one_line(r, "fsdpx-train", "it is built for AArch64");
}

TEST(InputPaths, AFifoNamedLikeAPluginIsNotOpened) {
  test::TempDir dir;
  ASSERT_EQ(::mkfifo((dir.path() / "blocks.so").c_str(), 0600), 0);
  auto r = run_command("timeout 20 " + plugins_tool() + " --plugin-dir " + dir.path().string() + " list");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("plugin file " + (dir.path() / "blocks.so").string() + " is a FIFO, not a shared library"),
            std::string::npos)
      << r.err;
}

// --- The INI accepts what the command line accepts, or refuses it; ranges -------------------

// A host flag written in the INI file takes effect: plugin-dir loads the folder's plugins, so the
// file can choose their components.
TEST(OptionEffects, PluginDirInTheIniFileLoadsItsPlugins) {
  test::TempDir dir;
  const fs::path plugins = dir.path() / "plugins";
  fs::create_directories(plugins);
  fs::copy_file(test::fixture("good"), plugins / "good.so");
  test::write_file(dir.path() / "run.ini",
                   "plugin-dir = " + plugins.string() + "\n[wrap]\nname = fixture_depth\ndepth = 2\n");
  auto r = run_command(train() + kQuick + "--config " + (dir.path() / "run.ini").string() + " --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("wrap=fixture_depth"), std::string::npos) << r.out;
}

// What only the command line can do (launch, act) is refused in the file, naming the key.
TEST(OptionEffects, CommandLineOnlyFlagsInTheIniFileAreRefused) {
  test::TempDir dir;
  for (const std::string key : {"nproc-per-node = 2", "dry-run = true", "allow-insecure-plugin-dir = true"}) {
    SCOPED_TRACE(key);
    const fs::path ini = dir.path() / "run.ini";
    test::write_file(ini, key + "\n");
    auto r = run_command(train() + kQuick + "--config " + ini.string() + " --dry-run");
    const std::string name = key.substr(0, key.find(' '));
    expect_one_line(r, "fsdpx-train",
                    "config file " + ini.string() + ": " + name + " is a command-line flag (--" + name +
                        "); an INI file cannot give it");
  }
}

// A value outside an option's range is refused, instead of being recorded in config.ini while
// the run used the preset's value.
TEST(OptionEffects, OutOfRangeComponentValuesAreRefused) {
  for (const char* opt : {"norm_eps", "rope_theta"}) {
    SCOPED_TRACE(opt);
    auto r = run_command(train() + kQuick + "--model." + opt + " -1 --dry-run");
    expect_one_line(r, "fsdpx-train", std::string("option model.") + opt + " expects a number ");
    EXPECT_NE(r.err.find("got '-1'"), std::string::npos) << r.err;
  }
}

// `host` with the plugins this build installed (FSDPX_PLUGIN_PATH's left out).
void discover_installed(PluginHost& host) {
  PluginSearch search;
  search.environment = false;
  ASSERT_TRUE(host.discover(search).empty());
}

// Every numeric option of every installed plugin declares its range.
TEST(OptionEffects, EveryNumericOptionOfTheInstalledPluginsDeclaresItsRange) {
  PluginHost host;
  discover_installed(host);
  int numeric = 0;
  for (const ComponentRecord* c : host.components())
    for (const OptionSpec& o : c->spec.options) {
      if (o.type == OptionType::Int) {
        EXPECT_TRUE(int_range(o)) << c->title() << " " << o.name;
      }
      if (o.type == OptionType::Float) {
        EXPECT_TRUE(float_range(o)) << c->title() << " " << o.name;
      }
      numeric += o.type == OptionType::Int || o.type == OptionType::Float;
    }
  EXPECT_GT(numeric, 30);
}

// ... and so does every numeric option of fsdpx-train: a word where a number belongs is refused
// with the expected type and range.
TEST(OptionEffects, EveryNumericHostOptionStatesItsTypeAndRange) {
  PluginHost host;
  host.load_file(test::plugin_dir() / "wrap_size_based.so");
  const auto options = train_command_options();
  int numeric = 0;
  for (const auto& o : options.options()) {
    const std::string key = o->long_name();
    const bool takes_value = o->semantic()->max_tokens() == 1 && !o->semantic()->is_composing();
    if (!takes_value || key == "nproc-per-node") continue;
    std::string message;
    try {
      RunConfig::resolve(host, {"--" + key, "abc"}, ConfigRequest{&options, {}, {}});
    } catch (const Error& e) {
      message = e.what();
    }
    if (message.empty()) continue;  // text options take "abc"
    ++numeric;
    EXPECT_NE(message.find("command line: --" + key + " expects a"), std::string::npos) << message;
    EXPECT_NE(message.find(", got 'abc'"), std::string::npos) << message;
  }
  EXPECT_GE(numeric, 20);
}

// --- Flags that cannot go together, refused before any worker starts -----------------------

TEST(FlagConflicts, TwoActionsAreRefused) {
  auto r = run_command(train() + kQuick + "--dry-run --check-comm");
  expect_one_line(r, "fsdpx-train", "--dry-run and --check-comm cannot go together");
  EXPECT_EQ(r.out, "");
}

// The launcher places its ranks: a --rank or --world-size beside it started two rank 0s, and the
// error then blamed a port.
TEST(FlagConflicts, TheLauncherWithRankFlagsIsRefusedBeforeAnyWorkerStarts) {
  for (const std::string flags : {"--check-comm --rank 0 --world-size 4", "--local-rank 1", "--num-nodes 2"}) {
    SCOPED_TRACE(flags);
    auto r = run_command(train() + kQuick + "--nproc-per-node 2 --rendezvous-timeout 5 " + flags);
    expect_one_line(r, "fsdpx-train", "cannot go together: the launcher places the 2 ranks it starts itself");
    EXPECT_EQ(r.err.find("[rank"), std::string::npos) << "no worker started: " << r.err;
  }
}

TEST(FlagConflicts, AnUnknownDeviceIsRefusedBeforeAnyWorkerStarts) {
  auto r = run_command(train() + kQuick + "--nproc-per-node 2 --device tpu");
  expect_one_line(r, "fsdpx-train", "--device must be cpu, cuda or sim, got 'tpu'");
}

TEST(FlagConflicts, CheckpointFlagsWithoutACheckpointAreRefused) {
  auto r = run_command(train() + kQuick + "--nproc-per-node 2 --keep-last 2");
  expect_one_line(r, "fsdpx-train", "--keep-last needs a checkpoint component, and the run has none");
  test::TempDir dir;
  r = run_command(train() + kQuick + "--checkpoint.name sharded --resume " + dir.path().string() + " --save-init " +
                  (dir.path() / "init").string() + " --dry-run");
  expect_one_line(r, "fsdpx-train", "--save-init and --resume " + dir.path().string() + " cannot go together");
}

// --- Messages -------------------------------------------------------------------------------

TEST(Messages, NumbersStateTheirTypeAndRangeAndIntegersPrintAsIntegers) {
  auto r = run_command(train() + " --steps abc --dry-run");
  expect_one_line(r, "fsdpx-train", "--steps expects an integer of at least 1, got 'abc'");
  r = run_command(train() + " --steps 99999999999999999999 --dry-run");
  expect_one_line(r, "fsdpx-train", "--steps expects an integer of at least 1, got '99999999999999999999'");
  r = run_command(train() + " --warmup-steps -1 --dry-run");
  expect_one_line(r, "fsdpx-train", "--warmup-steps expects an integer of at least 0, got '-1'");
  r = run_command(train() + " --optimizer.lr -1 --dry-run");
  expect_one_line(r, "fsdpx-train", "option optimizer.lr expects a number greater than 0, got '-1'");
  r = run_command(train() + " --rendezvous-timeout 0 --dry-run");
  expect_one_line(r, "fsdpx-train", "--rendezvous-timeout expects a number in [0.001, 10000000], got '0'");
  EXPECT_EQ(r.err.find(".000000"), std::string::npos) << r.err;
}

// Boost's own message for an option or value holding its placeholder never finished; the
// benchmarks and test workers (support/tool.cpp) hung on these, as fsdpx-train did (fuzz_config).
TEST(Messages, TextHoldingABoostPlaceholderEndsInTheUsualMessage) {
  const std::string bench = "timeout 20 " + (test::bin_dir() / "fsdpx-optim-bench").string();
  auto r = run_command(bench + " --%canonical_option%");
  EXPECT_EQ(r.exit_code, 2);
  expect_one_line(r, "fsdpx-optim-bench", "unrecognised option '--%canonical_option%' (see --help)");
  r = run_command(train() + " --steps 1%value% --dry-run");
  expect_one_line(r, "fsdpx-train", "--steps expects an integer of at least 1, got '1%value%'");
}

// A component's error names it once ("optimizer 'adamw' (plugin ...): ..."), not twice.
TEST(Messages, AComponentIsNamedOnce) {
  auto r = run_command(train() + kQuick + "--optimizer.betas 0.9 --dry-run");
  expect_one_line(r, "fsdpx-train", "optimizer 'adamw' (plugin optimizer_adamw): betas takes two numbers");
  EXPECT_EQ(r.err.find("optimizer 'adamw': optimizer 'adamw'"), std::string::npos) << r.err;
}

TEST(Messages, AMissingResumeDirectoryIsCalledMissing) {
  auto r = run_command(train() + kQuick + "--checkpoint.name sharded --resume /nonexistent/step-00000010 --dry-run");
  expect_one_line(r, "fsdpx-train", "--resume /nonexistent/step-00000010 does not exist");
}

// An INI line holding a NUL byte: the message is whole (a C string would end at the NUL) and names
// the line.
TEST(Messages, AnIniLineHoldingANulByteIsNamed) {
  test::TempDir dir;
  const fs::path ini = dir.path() / "run.ini";
  std::ofstream(ini, std::ios::binary) << "steps = 2\n" << std::string("seed = 1\0 7\n", 12);
  auto r = run_command(train() + kQuick + "--config " + ini.string() + " --dry-run");
  expect_one_line(r, "fsdpx-train", "config file " + ini.string() + ": line 2 holds a NUL byte; an INI file is text");
}

// Beyond its range a model size is one line, not a LibTorch stack trace; and a LibTorch error's
// message, where one gets through, has no stack trace either.
TEST(Messages, NoLibTorchStackTraces) {
  auto r = run_command(train() + kQuick + "--model.dim 2000000000 --dry-run");
  expect_one_line(r, "fsdpx-train", "option model.dim expects an integer in [0, 65536], got '2000000000'");
  try {
    TORCH_CHECK(false, "the check failed");
  } catch (const std::exception& e) {
    EXPECT_EQ(message_of(e), "the check failed");
  }
}

// A CSV file without a label column: the last column is a feature, and its values must not become
// classes (the advice was to raise --model.classes, which trained a feature as the label).
TEST(Messages, ACsvFeatureIsNotTakenForTheLabel) {
  test::TempDir dir;
  std::string rows;
  for (int i = 0; i < 40; ++i) rows += std::to_string(i % 7) + "," + std::to_string(i * 0.37) + "\n";
  test::write_file(dir.path() / "features.csv", rows);
  auto r = run_command(train() + " --model.name mlp --model.in_features 1 --wrap.name size_based --data.name csv "
                       "--batch-size 2 --steps 1 --data.path " + (dir.path() / "features.csv").string() + " --dry-run");
  expect_one_line(r, "fsdpx-train", "a number that is not a class index: it looks like a feature");
  EXPECT_EQ(r.err.find("--model.classes"), std::string::npos) << r.err;
}

// --- Every setting is read or refused, and takes effect or is refused ----------------------------

// The component of `kind` named `name`, created with `options` (its factory reads them).
void create_component(const PluginHost& host, Kind kind, const std::string& name, const Options& options) {
  switch (kind) {
    case Kind::Sharding: host.create<ShardingStrategy>(name, options); return;
    case Kind::Wrap: host.create<WrapPolicy>(name, options); return;
    case Kind::Precision: host.create<PrecisionPolicy>(name, options); return;
    case Kind::Optimizer: host.create<Optimizer>(name, options); return;
    case Kind::Checkpoint: host.create<CheckpointBackend>(name, options); return;
    case Kind::Model: host.create<Model>(name, options); return;
    case Kind::Data: host.create<DataSource>(name, options); return;
  }
}

// What a component needs given to be created at all (a data file, a pattern): small files in `dir`.
std::map<std::string, std::map<std::string, std::string>> creation_needs(const fs::path& dir) {
  std::string text, csv, pairs, tokens(2 * 64 * 200, '\1');
  for (int i = 0; i < 400; ++i) text += "line " + std::to_string(i) + " of a small corpus to train on\n";
  for (int i = 0; i < 60; ++i) csv += std::to_string(i * 0.5) + "," + std::to_string(i % 3) + "\n";
  for (int i = 0; i < 60; ++i) pairs += R"({"source": "ab )" + std::to_string(i) + R"(", "target": "cd"})" "\n";
  test::write_file(dir / "corpus.txt", text);
  test::write_file(dir / "rows.csv", csv);
  test::write_file(dir / "pairs.jsonl", pairs);
  test::write_file(dir / "tokens.bin", tokens);
  {  // 4 grey 2x2 images and their labels
    const at::Tensor images = at::zeros({4, 1, 2, 2}, at::kByte), labels = at::zeros({4}, at::kLong);
    SafetensorsWriter w((dir / "images.safetensors").string(),
                        {{"images", at::kByte, images.sizes().vec()}, {"labels", at::kLong, {4}}}, {});
    w.write(images);
    w.write(labels);
    w.close();
  }
  return {{"data.images", {{"path", (dir / "images.safetensors").string()}}},
          {"data.text", {{"path", (dir / "corpus.txt").string()}}},
          {"data.csv", {{"path", (dir / "rows.csv").string()}}},
          {"data.seq2seq", {{"path", (dir / "pairs.jsonl").string()}}},
          {"data.tokens", {{"path", (dir / "tokens.bin").string()}}},
          {"wrap.fqn_regex", {{"pattern", "layers\\.[0-9]+"}}}};
}

// The walk over every option of every installed plugin: each component, created as a run creates
// it, reads every option it declares. An option nothing reads would be accepted and do nothing.
TEST(EveryOption, EveryOptionOfEveryInstalledPluginIsReadByItsComponent) {
  test::TempDir dir;
  const auto needs = creation_needs(dir.path());
  PluginHost host;
  discover_installed(host);
  int walked = 0;
  for (const ComponentRecord* c : host.components()) {
    const std::string id = std::string(section_name(c->spec.kind)) + "." + c->spec.name;
    const auto need = needs.count(id) ? needs.at(id) : std::map<std::string, std::string>{};
    const Options options = host.options_for(c->spec.kind, c->spec.name, need);
    EXPECT_EQ(test::error_of([&] { create_component(host, c->spec.kind, c->spec.name, options); }), "(no error)")
        << id;
    for (const OptionSpec& o : c->spec.options) {
      EXPECT_TRUE(options.was_read(o.name)) << c->title() << " declares option " << o.name << " and never reads it";
      ++walked;
    }
  }
  EXPECT_GT(walked, 80);
}

// ... and over every option of fsdpx-train: what the host reads before planning (the same calls
// as its main) reads every option it declares. Two are consumed before the configuration is
// resolved and never reach it: --help (answered at once) and --nproc-per-node (the launcher's).
TEST(EveryOption, EveryOptionOfFsdpxTrainIsReadByTheHost) {
  PluginHost host;
  discover_installed(host);
  const auto options = train_command_options();
  const RunConfig config = RunConfig::resolve(host, {"--data.name", "synthetic"}, train_config_request(options));
  check_train_flags(config, 0);
  TrainSettings::from(config.host_values());
  runtime_options(config.host_values(), resolve_topology(topology_flags(config.host_values()), {}).topology);
  int walked = 0;
  for (const auto& o : options.options()) {
    const std::string key = o->long_name();
    if (key == "help" || key == "nproc-per-node") continue;
    EXPECT_TRUE(config.host_values().was_read(key)) << "fsdpx-train declares --" << key << " and never reads it";
    ++walked;
  }
  EXPECT_GT(walked, 30);
}

// A key given and left unread is refused when the run is planned, naming where it came from.
TEST(EveryOption, AGivenKeyNothingReadsIsRefusedNamingWhereItCameFrom) {
  PluginHost host;
  discover_installed(host);
  test::TempDir dir;
  const fs::path ini = dir.path() / "run.ini";
  test::write_file(ini, "# a run\nsteps = 3\n\n[data]\nname = synthetic\nseq = 16\n");
  const auto options = train_command_options();
  RunConfig config = RunConfig::resolve(host, {"--config", ini.string(), "--data.vocab", "64"},
                                        train_config_request(options));
  EXPECT_EQ(config.unread(), "command line --data.vocab is accepted, but nothing in this run reads it (data source "
                             "'synthetic' does not use it in this configuration); drop it");
  host.create<DataSource>("synthetic", config.choice(Kind::Data)->options);
  EXPECT_EQ(config.unread(), "config file " + ini.string() + ":2: steps is accepted, but nothing in this run reads "
                             "it; drop it");
  config.host_values()["steps"];
  EXPECT_EQ(config.unread(), "");
  // config.ini: the options the run read; of a component not created (none here but the data), its name.
  const std::string used = config.used_ini();
  EXPECT_NE(used.find("\n[model]\nname=gpt\n\n"), std::string::npos) << used;
  EXPECT_NE(used.find("\n[data]\nname=synthetic\nsamples=4096\nseq=16\nvocab=64\n"), std::string::npos) << used;
  EXPECT_NE(config.to_ini().find("\nsize=tiny\n"), std::string::npos);  // to_ini: every option
}

// An FSDPX_* variable meant for a run and misspelt changed nothing; it is refused, naming the setting.
TEST(EveryOption, AMisspeltEnvironmentSettingIsRefused) {
  auto r = run_command("env FSDPX_SIM_MEMROY=64MiB " + train() + kQuick + "--dry-run");
  expect_one_line(r, "fsdpx-train", "environment: FSDPX_SIM_MEMROY is not a setting fsdpx reads, so it would change "
                                    "nothing; unset it, or did you mean FSDPX_SIM_MEMORY?");
  EXPECT_EQ(run_command("env FSDPX_PYTHON=python3 " + train() + kQuick + "--dry-run").exit_code, 0);  // a tool's
}

// Issue 37's instances, each accepted with exit 0 and not a word at 44ce5f0.
// 1. `config = other.ini` inside an INI file: a run reads one file, so this one is never read.
TEST(OptionEffects, AConfigKeyInsideTheIniFileIsRefused) {
  test::TempDir dir;
  const fs::path ini = dir.path() / "run.ini", other = dir.path() / "other.ini";
  test::write_file(other, "steps = 5\n");
  test::write_file(ini, "steps = 1\nconfig = " + other.string() + "\n");
  auto r = run_command(train() + kQuick + "--config " + ini.string() + " --dry-run");
  expect_one_line(r, "fsdpx-train", "config file " + ini.string() + ":2: config = " + other.string() +
                                        " would never be read: a run reads one INI file, the one --config names on "
                                        "the command line; merge the two files, or give --config " + other.string());
}

// 2. bf16_mixed's fp32_units naming no unit kept nothing in fp32; as fqn_regex's pattern and
// --activation-checkpointing, it is refused, with the units it could name.
TEST(OptionEffects, Fp32UnitsMatchingNoUnitIsRefused) {
  const std::string bf16 = kQuick + "--precision.name bf16_mixed --dry-run --precision.fp32_units ";
  auto r = run_command(train() + bf16 + "'root,layer\\.0'");
  expect_one_line(r, "fsdpx-train", "precision 'bf16_mixed': fp32_units: 'layer\\.0' matches no unit, so it would "
                                    "keep nothing in fp32; the units are: root, layers.0, layers.1");
  r = run_command(train() + bf16 + "'root,layers\\.0'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// float8 that would compute nothing in float8 (a model whose layers call at::linear, as mlp's; a
// float8_units pattern naming no unit) or cannot (fp16 without loss scaling) is refused.
TEST(OptionEffects, Float8ThatWouldComputeNothingInFloat8IsRefused) {
  auto r = run_command(train() + " --model.name mlp --data.name csv --data.path " + test::csv_path() +
                       " --wrap.layer_types Hidden --precision.name float8 --steps 1 --batch-size 4" + test::kNoEval);
  expect_one_line(r, "fsdpx-train", "the precision policy computes the linear layers of root, layers.0, layers.1 in "
                                    "float8, and none of them computed a float8 linear in this forward");
  EXPECT_NE(r.err.find("use --precision bf16_mixed for this model"), std::string::npos) << r.err;
  const std::string f8 = kQuick + "--precision.name float8 --dry-run ";
  r = run_command(train() + f8 + "--precision.float8_units 'layers\\.9'");
  expect_one_line(r, "fsdpx-train", "precision 'float8': float8_units: 'layers\\.9' matches no unit, so it would "
                                    "compute nothing in float8; the units are: root, layers.0, layers.1");
  r = run_command(train() + f8 + "--precision.param_dtype fp16");
  expect_one_line(r, "fsdpx-train", "fp16 needs loss scaling, which float8 does not do; use bf16");
  r = run_command(train() + f8 + "--precision.float8_units 'layers\\.1'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("float8     the linear layers of 1 of the units below"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bf16/fp32 float8"), std::string::npos) << r.out;
}

// float8 all-gather where it would gather nothing in float8: a layout that gathers nothing, a model
// that does not list its linear weights (t5), float8 units without such weights (gpt's root).
TEST(OptionEffects, Float8AllGatherThatWouldGatherNothingInFloat8IsRefused) {
  const std::string f8 =
      kQuick + "--nproc-per-node 2 --precision.name float8 --precision.float8_all_gather true --dry-run ";
  const std::string what = "float8 all-gather (--precision.float8_all_gather true) ";
  auto r = run_command(train() + f8 + "--sharding.name no_shard");
  expect_one_line(r, "fsdpx-train",
                  what +
                      "casts each shard to float8 before its all-gather, and this layout's "
                      "shard group is one rank, which gathers nothing");
  r = run_command(train() + f8 + "--model.name t5 --wrap.layer_types T5Block");
  expect_one_line(r, "fsdpx-train",
                  what +
                      "needs a model that lists the parameters only fsdpx::linear reads "
                      "(fsdpx::LinearWeights, fsdpx/capabilities.h), and this one does not");
  r = run_command(train() + f8 + "--precision.float8_units root");
  expect_one_line(r, "fsdpx-train", what + "found no parameter to gather in float8");
  r = run_command(train() + kQuick + "--precision.name bf16_mixed --precision.float8_all_gather true --dry-run");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("float8_all_gather"), std::string::npos) << r.err;
}

// 3. --eval-every on data without a held-out share evaluated nothing.
TEST(OptionEffects, EvalEveryWithoutHeldOutDataIsRefused) {
  auto r = run_command(train() + kQuick + "--eval-every 5 --dry-run");
  expect_one_line(r, "fsdpx-train", "--eval-every 5 would evaluate nothing: data 'synthetic' has no held-out share; "
                                    "drop --eval-every, or use data that holds samples out (text, csv, seq2seq)");
  EXPECT_EQ(run_command(train() + kQuick + "--eval-every 0 --dry-run").exit_code, 0);
}

// 4. --model.size beside --model.from_hf was dropped for the Hugging Face configuration, and
// config.ini recorded size=small. Refused now; and config.ini records only what the run read.
TEST(OptionEffects, ModelSizeWithFromHfIsRefusedAndConfigIniRecordsOnlyWhatWasRead) {
  test::TempDir dir;
  const std::string d = dir.path().string(), quick = kQuick + "--log-every 1 ";
  auto r = run_command(train() + quick + "--save-init " + d + "/init --out " + d + "/run0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_command(test::ckpt() + " export-hf " + d + "/init " + d + "/hf");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_command(train() + quick + "--model.from_hf " + d + "/hf --model.size small --dry-run");
  expect_one_line(r, "fsdpx-train", "--model.size conflicts with --model.from_hf: the configuration comes from " + d +
                                        "/hf/config.json; drop --model.size");
  r = run_command(train() + quick + "--model.from_hf " + d + "/hf --out " + d + "/run1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string ini = test::read_file(dir.path() / "run1" / "config.ini");
  const size_t at = ini.find("[model]");
  ASSERT_NE(at, std::string::npos) << ini;
  const std::string model = ini.substr(at, ini.find("\n\n", at) - at);
  EXPECT_NE(model.find("from_hf=" + d + "/hf\n"), std::string::npos) << ini;
  EXPECT_EQ(model.find("size="), std::string::npos) << ini;
  r = run_command(train() + " --config " + d + "/run1/config.ini --out " + d + "/run2 --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// --min-lr-ratio is the cosine schedule's floor: given with the constant schedule it did nothing
// (exit 0, and config.ini recorded it). Refused; config.ini records it only for cosine.
TEST(OptionEffects, MinLrRatioWithoutTheCosineScheduleIsRefused) {
  auto r = run_command(train() + kQuick + "--min-lr-ratio 0.2 --dry-run");
  expect_one_line(r, "fsdpx-train",
                  "--min-lr-ratio 0.2 is the cosine schedule's floor, and --lr-schedule is constant, whose lr never "
                  "decays; drop --min-lr-ratio, or add --lr-schedule cosine");
  EXPECT_EQ(run_command(train() + kQuick + "--min-lr-ratio 0.2 --lr-schedule cosine --dry-run").exit_code, 0);
  test::TempDir dir;
  for (const std::string schedule : {"constant", "cosine"}) {
    const fs::path out = dir.path() / schedule;
    r = run_command(train() + kQuick + "--lr-schedule " + schedule + " --out " + out.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const bool recorded = test::read_file(out / "config.ini").find("\nmin-lr-ratio=0.1\n") != std::string::npos;
    EXPECT_EQ(recorded, schedule == "cosine") << schedule;
  }
}

// The documented no-ops say so once at start and config.ini records them as not applied:
// sim's settings on another device (FSDPX_SIM_MEMORY was read by nothing and said nothing).
// cpu_offload on the CPU: CpuOffload.OnTheCpuItIsTheBaseStrategyBitForBit.
TEST(OptionEffects, SimSettingsOnAnotherDeviceAreNotAppliedAndSaySo) {
  test::TempDir dir;
  const std::string note = "not applied: FSDPX_SIM_MEMORY=1GiB is a setting of the sim device, and this run's device "
                           "is cpu; unset it, or run with --device sim";
  auto r = run_command("env FSDPX_SIM_MEMORY=1GiB " + train() + kQuick + "--out " + dir.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::count_of(r.out + r.err, note), 1) << r.out << r.err;
  EXPECT_NE(test::read_file(dir.path() / "config.ini").find("# " + note + "\n"), std::string::npos);
  r = run_command("env FSDPX_SIM_MEMORY=1GiB " + train() + kQuick + "--dry-run");
  EXPECT_NE(r.out.find("  not applied FSDPX_SIM_MEMORY=1GiB"), std::string::npos) << r.out;
  r = run_command(train() + kQuick + "--dry-run");
  EXPECT_EQ(r.out.find("not applied"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace fsdpx
