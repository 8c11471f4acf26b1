// fsdpx-plugins as a user runs it: output and exit codes.
#include <regex>

#include <gtest/gtest.h>

#include "fsdpx/abi.h"
#include "test_paths.h"

namespace fsdpx {
namespace {

std::string tool() { return (test::bin_dir() / "fsdpx-plugins").string(); }

TEST(FsdpxPluginsCli, ListShowsInstalledComponentsAsATable) {
  auto r = test::run_command(tool() + " list");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^kind +name +version +file\n"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\nwrap +size_based +0\\.1\\.0 +" +
                                                  (test::plugin_dir() / "wrap_size_based.so").string() + "\n")))
      << r.out;
}

TEST(FsdpxPluginsCli, ShowPrintsOptionsWithTypesDefaultsAndHelp) {
  auto r = test::run_command(tool() + " show size_based");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("wrap policy 'size_based' from plugin wrap_size_based 0.1.0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("choose it with --wrap.name size_based  or  [wrap] name=size_based"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  min_num_params  int >= 1  '100000000'  smallest number of parameter elements"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(test::run_command(tool() + " show wrap.size_based").out, r.out);
}

TEST(FsdpxPluginsCli, ExtraPluginsFromFlags) {
  auto r = test::run_command(tool() + " --plugin " + test::fixture("good").string() +
                             " show fixture_depth");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("  recompute  bool  'false'  checkpoint the activations of each unit"), std::string::npos)
      << r.out;
}

TEST(FsdpxPluginsCli, ErrorsExitNonZeroWithOneClearLine) {
  auto r = test::run_command(tool() + " show sized_based");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "fsdpx-plugins: no installed component is named 'sized_based'; did you mean "
                   "'size_based'? See `fsdpx-plugins list`.\n");
  r = test::run_command(tool() + " lsit");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "fsdpx-plugins: unknown command 'lsit'; did you mean 'list'? Commands: list, "
                   "show, config, plan, explain, info, help.\n");
  r = test::run_command(tool() + " --plugin " + test::fixture("wrong_torch").string() + " list");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("was built against LibTorch 1.13.1"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("size_based"), std::string::npos) << "the good plugins are still listed";
}

TEST(FsdpxPluginsCli, ConfigPrintsTheResolvedIni) {
  test::TempDir dir;
  test::write_file(dir.path() / "run.ini", "[wrap]\nname=size_based\nmin_num_params=64\n");
  auto from_file = test::run_command(tool() + " config --config " + (dir.path() / "run.ini").string());
  auto from_cli = test::run_command(tool() + " config --wrap.name size_based --wrap.min_num_params 64");
  EXPECT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_EQ(from_file.out, "[wrap]\nname=size_based\nmin_num_params=64\n");
  EXPECT_EQ(from_cli.out, from_file.out);
  auto bad = test::run_command(tool() + " config --wrap.name size_based --wrap.min_num_params x");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.err, "fsdpx-plugins: wrap policy 'size_based' (plugin wrap_size_based): option "
                     "wrap.min_num_params expects an integer of at least 1, got 'x'\n");
}

TEST(FsdpxPluginsCli, PlanPrintsTheUnitsOfAPolicy) {
  auto r = test::run_command(tool() + " plan --model.name gpt --model.size 7b --wrap.name layer_type");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Llama-2-7B's shape: 32 blocks of 202,383,360 parameters; embedding, norm and output in the root.
  EXPECT_NE(r.out.find("  layers.31       202383360         9  no"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("33 units, 6738415616 parameters"), std::string::npos) << r.out;
  auto bad = test::run_command(tool() + " plan --model.name gpt --wrap.name layer_type --wrap.layer_types Blok");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("layer_type selected no unit: no submodule is a Blok; the model's submodule types are: "),
            std::string::npos) << bad.err;
}

TEST(FsdpxPluginsCli, ExplainPrintsThePrecisionAudit) {
  auto r = test::run_command(tool() + " explain --precision.name bf16_mixed --optimizer.name anyprecision_adamw");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "precision bf16_mixed, for all parameters\n"
            "  storage (sharded parameters)                 Float\n"
            "  compute (forward/backward)                   BFloat16\n"
            "  all-gather                                   BFloat16\n"
            "  reduce-scatter / all-reduce                  Float\n"
            "  gradient (sharded, for the optimizer)        Float\n"
            "  model output (loss)                          Float\n"
            "  optimizer state exp_avg (anyprecision_adamw) Float\n"
            "  optimizer state exp_avg_sq (anyprecision_adamw) BFloat16\n");
  auto kahan = test::run_command(tool() + " explain --precision.name bf16_mixed --optimizer.name anyprecision_adamw "
                                          "--optimizer.use_kahan_summation true");
  EXPECT_EQ(kahan.exit_code, 1);
  EXPECT_NE(kahan.err.find("use_kahan_summation is for low-precision parameters"), std::string::npos) << kahan.err;
  auto pure = test::run_command(tool() + " explain --precision.name pure_bf16 --optimizer.name anyprecision_adamw "
                                         "--optimizer.use_kahan_summation true");
  EXPECT_NE(pure.out.find("optimizer state compensation (anyprecision_adamw) BFloat16"), std::string::npos) << pure.out;
}

// With a model and a wrap policy, each unit's own dtypes (bf16_mixed keeping the root in fp32).
TEST(FsdpxPluginsCli, ExplainShowsEachUnitsDtypes) {
  auto r = test::run_command(tool() +
                             " explain --precision.name bf16_mixed --precision.fp32_units root --model.name gpt "
                             "--wrap.name layer_type");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("precision bf16_mixed, for the root unit\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per unit (model gpt, wrap policy layer_type): compute and all-gather / reduce\n"
                       "  (root)                                       Float / Float\n"
                       "  layers.0                                     BFloat16 / Float\n"
                       "  layers.1                                     BFloat16 / Float\n"),
            std::string::npos)
      << r.out;
}

TEST(FsdpxPluginsCli, InfoReportsVersions) {
  auto r = test::run_command(tool() + " info");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string abi = std::to_string(FSDPX_ABI_MAJOR) + "." + std::to_string(FSDPX_ABI_MINOR);
  EXPECT_NE(r.out.find("plugin ABI    " + abi + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("LibTorch      2.11.0 (_GLIBCXX_USE_CXX11_ABI=1)"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace fsdpx
