// RunConfig: an INI file and the command line give the same configuration, the command line
// wins, and every bad input names the option.
#include <functional>

#include <boost/program_options/value_semantic.hpp>
#include <gtest/gtest.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "test_paths.h"

namespace fsdpx {
namespace {
namespace po = boost::program_options;

class RunConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host.load_file(test::plugin_dir() / "wrap_size_based.so");
    host.load_file(test::fixture("good"));
    host_options.add_options()("steps", po::value<int>()->default_value(10), "steps to train");
  }
  RunConfig resolve(const std::vector<std::string>& args, std::map<Kind, std::string> defaults = {}) {
    return RunConfig::resolve(host, args, ConfigRequest{&host_options, std::move(defaults), {}});
  }
  std::string error_of(const std::vector<std::string>& args) {
    try {
      resolve(args);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  PluginHost host;
  po::options_description host_options;
  test::TempDir dir;
};

TEST_F(RunConfigTest, IniFileAndCommandLineGiveTheSameConfiguration) {
  const auto ini = dir.path() / "run.ini";
  test::write_file(ini, "steps = 7\n[wrap]\nname = size_based\nmin_num_params = 1000\n");
  RunConfig from_file = resolve({"--config", ini.string()});
  RunConfig from_cli = resolve({"--steps", "7", "--wrap.name", "size_based",
                                "--wrap.min_num_params=1000"});
  EXPECT_EQ(from_file.to_ini(), from_cli.to_ini());
  EXPECT_EQ(from_cli.to_ini(), "[wrap]\nname=size_based\nmin_num_params=1000\n");
  EXPECT_EQ(from_file.host_values()["steps"].as<int>(), 7);
  EXPECT_EQ(from_cli.host_values()["steps"].as<int>(), 7);
  EXPECT_EQ(from_file.choice(Kind::Wrap)->options.get_int("min_num_params"), 1000);
}

TEST_F(RunConfigTest, ResolvedIniReproducesTheRun) {
  RunConfig first = resolve({"--wrap.name", "fixture_depth", "--wrap.recompute", "on"});
  const auto ini = dir.path() / "resolved.ini";
  test::write_file(ini, first.to_ini());
  EXPECT_EQ(resolve({"--config", ini.string()}).to_ini(), first.to_ini());
  EXPECT_EQ(first.to_ini(), "[wrap]\nname=fixture_depth\ndepth=1\nrecompute=true\n");
}

TEST_F(RunConfigTest, CommandLineWinsOverTheFile) {
  const auto ini = dir.path() / "run.ini";
  test::write_file(ini, "[wrap]\nname=fixture_depth\ndepth=3\nrecompute=true\n");
  RunConfig c = resolve({"--config", ini.string(), "--wrap.depth", "5"});
  EXPECT_EQ(c.choice(Kind::Wrap)->options.get_int("depth"), 5);
  EXPECT_TRUE(c.choice(Kind::Wrap)->options.get_bool("recompute"));
  // Choosing another component on the command line drops the file's options for the old one
  // only if they do not apply: here the file's depth/recompute are unknown to size_based.
  EXPECT_EQ(error_of({"--config", ini.string(), "--wrap.name", "size_based"}),
            "wrap policy 'size_based' (plugin wrap_size_based) has no option 'depth' (given as "
            "wrap.depth). Its options: min_num_params.");
}

TEST_F(RunConfigTest, DefaultsApplyWhereNothingChooses) {
  RunConfig c = resolve({}, {{Kind::Wrap, "size_based"}});
  EXPECT_EQ(c.to_ini(), "[wrap]\nname=size_based\nmin_num_params=100000000\n");
  EXPECT_EQ(resolve({}).components().size(), 0u);
}

TEST_F(RunConfigTest, BadInputNamesTheOption) {
  EXPECT_EQ(error_of({"--wrap.name", "size_based", "--wrap.min_params", "5"}),
            "wrap policy 'size_based' (plugin wrap_size_based) has no option 'min_params' (given "
            "as wrap.min_params); did you mean 'min_num_params'? Its options: min_num_params.");
  EXPECT_EQ(error_of({"--wrap.name", "size_based", "--wrap.min_num_params", "many"}),
            "wrap policy 'size_based' (plugin wrap_size_based): option wrap.min_num_params "
            "expects an integer of at least 1, got 'many'");
  EXPECT_EQ(error_of({"--wrap.name", "sized_based"}),
            "unknown wrap policy 'sized_based' (wrap.name); did you mean 'size_based'? "
            "Available: fixture_depth, size_based.");
  EXPECT_EQ(error_of({"--wrap.min_num_params", "5"}),
            "command line: option wrap.min_num_params needs a wrap policy, but none is chosen; "
            "choose one with --wrap.name NAME (or [wrap] name=NAME in the config file)");
  EXPECT_EQ(error_of({"--stpes", "5"}),
            "command line: unknown option --stpes; did you mean --steps? (see --help for the "
            "options)");
  EXPECT_EQ(error_of({"--steps", "five"}),
            "command line: the argument ('five') for option '--steps' is invalid");
  EXPECT_EQ(error_of({"stray"}),
            "command line: unexpected argument 'stray'; options take the form "
            "--<section>.<option> VALUE (see --help)");
  EXPECT_EQ(error_of({"--config", "/nonexistent/run.ini"}),
            "config file /nonexistent/run.ini does not exist (--config)");
}

TEST_F(RunConfigTest, BadFileNamesTheFile) {
  const auto ini = dir.path() / "bad.ini";
  test::write_file(ini, "[wrap]\nname=size_based\nthis line has no equals sign\n");
  EXPECT_EQ(error_of({"--config", ini.string()}),
            "config file " + ini.string() +
                ": the options configuration file contains an invalid line 'this line has no "
                "equals sign'");
  test::write_file(ini, "[wrap]\nname=size_based\nmin_num_params=1e3\n");
  EXPECT_EQ(error_of({"--config", ini.string()}),
            "wrap policy 'size_based' (plugin wrap_size_based): option wrap.min_num_params "
            "expects an integer of at least 1, got '1e3'");
  test::write_file(ini, "[wrapp]\nname=size_based\n");
  EXPECT_EQ(error_of({"--config", ini.string()}),
            "config file " + ini.string() +
                ": unknown option wrapp.name; did you mean wrap.name? (see --help for the "
                "options)");
}

}  // namespace
}  // namespace fsdpx

namespace fsdpx {
namespace {

// Found by tests/fuzz/fuzz_config: Boost's message for a value or an INI line that itself holds
// one of its placeholders ("%value%", "%invalid_line%") never finished. fsdpx fills each
// placeholder once (option_error_text), so the message is the usual one, with the text as given.
TEST_F(RunConfigTest, TextHoldingABoostPlaceholderGetsTheUsualMessage) {
  EXPECT_EQ(error_of({"--steps", "1%value%"}),
            "command line: the argument ('1%value%') for option '--steps' is invalid");
  const auto ini = dir.path() / "percent.ini";
  test::write_file(ini, "steps = 2%value%x\n");
  EXPECT_EQ(error_of({"--config", ini.string()}),
            "config file " + ini.string() + ": the argument ('2%value%x') for option 'steps' is invalid");
  test::write_file(ini, "[wrap]\n%invalid_line% %canonical_option% %prefix%\n");
  EXPECT_EQ(error_of({"--config", ini.string()}),
            "config file " + ini.string() +
                ": the options configuration file contains an invalid line "
                "'%invalid_line% %canonical_option% %prefix%'");
}

// `none` leaves out a kind the host can do without, from the command line over a file's choice
// and from a file; the resolved INI keeps it off. For a kind the host needs, and for an empty
// name, the error says what to give.
TEST_F(RunConfigTest, NoneSwitchesOffAnOptionalKind) {
  auto with_optional = [&](const std::vector<std::string>& args) {
    return RunConfig::resolve(host, args, ConfigRequest{&host_options, {{Kind::Wrap, "size_based"}}, {Kind::Wrap}});
  };
  const auto ini = dir.path() / "wrap.ini";
  test::write_file(ini, "[wrap]\nname = size_based\n");
  RunConfig off = with_optional({"--config", ini.string(), "--wrap.name", "none"});
  EXPECT_EQ(off.choice(Kind::Wrap), nullptr);
  EXPECT_TRUE(off.switched_off(Kind::Wrap));
  EXPECT_EQ(off.to_ini(), "[wrap]\nname=none\n");
  const auto resolved = dir.path() / "resolved.ini";
  test::write_file(resolved, off.to_ini());
  EXPECT_EQ(with_optional({"--config", resolved.string()}).choice(Kind::Wrap), nullptr);  // not the default again
  EXPECT_NE(with_optional({}).choice(Kind::Wrap), nullptr);

  EXPECT_EQ(error_of({"--wrap.name", "none"}),
            "--wrap.name none: a run needs a wrap policy; give one's name (fsdpx-plugins list shows them)");
  std::string empty;
  try {
    with_optional({"--wrap.name", ""});
  } catch (const Error& e) {
    empty = e.what();
  }
  EXPECT_EQ(empty, "--wrap.name is empty: give a wrap policy's name (fsdpx-plugins list shows them), or none to run "
                   "without a wrap policy");
}

}  // namespace
}  // namespace fsdpx
