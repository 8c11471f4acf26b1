// Every way a plugin can fail to load or to be used, each with its exact message. One fixture
// plugin per failure (tests/fixtures/).
#include <sys/stat.h>

#include <filesystem>
#include <functional>

#include <gtest/gtest.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/wrap_policy.h"
#include "test_paths.h"

namespace fsdpx {
namespace {
namespace fs = std::filesystem;
using test::fixture;

using test::error_of;

fs::path size_based() { return test::plugin_dir() / "wrap_size_based.so"; }

TEST(PluginErrors, NotALoadableLibraryCarriesTheLoaderMessage) {
  test::TempDir dir;
  const fs::path p = dir.path() / "fake.so";
  test::write_file(p, "this is not a shared library\n");
  PluginHost host;
  EXPECT_EQ(error_of([&] { host.load_file(p); }),
            "cannot load plugin " + p.string() + ": not a loadable library: " + p.string() +
                ": file too short");
}

TEST(PluginErrors, MissingFile) {
  PluginHost host;
  EXPECT_EQ(error_of([&] { host.load_file("/nonexistent/x.so"); }),
            "plugin file /nonexistent/x.so does not exist");
}

TEST(PluginErrors, NoEntrySymbolIsAnErrorWhenNamed) {
  PluginHost host;
  const fs::path p = fixture("no_entry");
  EXPECT_EQ(error_of([&] { host.load_file(p); }),
            p.string() + " is not an fsdpx plugin: it does not export fsdpx_plugin_entry "
                         "(declare one with FSDPX_PLUGIN from <fsdpx/plugin.h>)");
}

TEST(PluginErrors, NoEntrySymbolIsQuietWhileScanning) {
  test::TempDir dir;
  fs::copy_file(fixture("no_entry"), dir.path() / "no_entry.so");
  fs::copy_file(fixture("good"), dir.path() / "good.so");
  PluginHost host;
  EXPECT_TRUE(host.load_directory(dir.path(), false).empty());
  ASSERT_EQ(host.plugins().size(), 1u);
  EXPECT_EQ(host.plugins()[0]->name, "fixture_good");
}

TEST(PluginErrors, AbiMajorMismatchGivesBothNumbers) {
  PluginHost host;
  const fs::path p = fixture("wrong_abi_major");
  EXPECT_EQ(error_of([&] { host.load_file(p); }),
            p.string() + ": built for fsdpx plugin ABI 2.0, this host speaks 1.2; rebuild the "
                         "plugin against this fsdpx SDK");
}

TEST(PluginErrors, NewerAbiMinorIsRefused) {
  PluginHost host;
  const fs::path p = fixture("wrong_abi_minor");
  EXPECT_EQ(error_of([&] { host.load_file(p); }),
            p.string() + ": built for fsdpx plugin ABI 1.7, this host speaks 1.2; rebuild the "
                         "plugin against this fsdpx SDK");
}

TEST(PluginErrors, LibTorchVersionMismatch) {
  PluginHost host;
  const fs::path p = fixture("wrong_torch");
  EXPECT_EQ(error_of([&] { host.load_file(p); }),
            p.string() + ": plugin 'fixture_torch' was built against LibTorch 1.13.1, but this "
                         "host runs LibTorch 2.11.0; rebuild it against 2.11.0");
}

TEST(PluginErrors, CxxAbiMismatch) {
  PluginHost host;
  const fs::path p = fixture("wrong_cxx_abi");
  EXPECT_EQ(error_of([&] { host.load_file(p); }),
            p.string() + ": plugin 'fixture_cxx_abi' was built with _GLIBCXX_USE_CXX11_ABI=0, but "
                         "this host uses _GLIBCXX_USE_CXX11_ABI=1; rebuild it with LibTorch's "
                         "compile flags (fsdpx_add_plugin sets them)");
}

TEST(PluginErrors, DuplicatePluginNameNamesBothPaths) {
  PluginHost host;
  host.load_file(fixture("good"));
  const fs::path copy = fixture("good_copy");
  EXPECT_EQ(error_of([&] { host.load_file(copy); }),
            copy.string() + ": plugin 'fixture_good' is already loaded from " +
                fixture("good").string() + "; remove one of the two copies");
  EXPECT_EQ(host.plugins().size(), 1u);
}

TEST(PluginErrors, DuplicateComponentNameNamesBothPathsAndRollsBack) {
  PluginHost host;
  host.load_file(size_based());
  const fs::path p = fixture("duplicate_component");
  EXPECT_EQ(error_of([&] { host.load_file(p); }),
            p.string() + ": plugin 'fixture_duplicate_component' registers wrap policy "
                         "'size_based', which plugin 'wrap_size_based' already registered from " +
                size_based().string() + "; remove one of the two plugins");
  ASSERT_EQ(host.plugins().size(), 1u);
  EXPECT_EQ(host.find(Kind::Wrap, "size_based").plugin->name, "wrap_size_based");
}

TEST(PluginErrors, RegistrationThatThrowsIsRolledBack) {
  PluginHost host;
  const fs::path p = fixture("throws");
  EXPECT_EQ(error_of([&] { host.load_file(p); }),
            p.string() + ": plugin 'fixture_throws' failed while registering its components: "
                         "deliberate failure after the first registration; none of its "
                         "components were registered");
  EXPECT_TRUE(host.plugins().empty());
  EXPECT_TRUE(host.components().empty());
  // The plugin's name is free again: nothing of it was kept.
  EXPECT_EQ(error_of([&] { host.find(Kind::Wrap, "fixture_half"); }),
            "unknown wrap policy 'fixture_half' (wrap.name); no wrap policy plugin is loaded (see "
            "`fsdpx-plugins list`, --plugin-dir, FSDPX_PLUGIN_PATH)");
}

TEST(PluginErrors, InvalidDeclaredDefaultIsAPluginError) {
  PluginHost host;
  const fs::path p = fixture("bad_default");
  EXPECT_EQ(error_of([&] { host.load_file(p); }),
            p.string() + ": wrap policy 'fixture_bad_default' (plugin fixture_bad_default): option "
                         "wrap.limit (declared default) expects an integer, got 'lots'");
  EXPECT_TRUE(host.plugins().empty());
}

TEST(PluginErrors, UnknownComponentSuggestsTheClosestName) {
  PluginHost host;
  host.load_file(size_based());
  host.load_file(fixture("good"));
  EXPECT_EQ(error_of([&] { host.create<WrapPolicy>("sized_based"); }),
            "unknown wrap policy 'sized_based' (wrap.name); did you mean 'size_based'? "
            "Available: fixture_depth, size_based.");
  EXPECT_EQ(error_of([&] { host.create<WrapPolicy>("zzz"); }),
            "unknown wrap policy 'zzz' (wrap.name). Available: fixture_depth, size_based.");
}

TEST(PluginErrors, UnknownOptionNamesThePluginAndSuggests) {
  PluginHost host;
  host.load_file(size_based());
  EXPECT_EQ(error_of([&] { host.create<WrapPolicy>("size_based", {{"min_params", "5"}}); }),
            "wrap policy 'size_based' (plugin wrap_size_based) has no option 'min_params' (given "
            "as wrap.min_params); did you mean 'min_num_params'? Its options: min_num_params.");
}

TEST(PluginErrors, IllTypedOptionNamesTheExpectedType) {
  PluginHost host;
  host.load_file(size_based());
  EXPECT_EQ(error_of([&] { host.create<WrapPolicy>("size_based", {{"min_num_params", "lots"}}); }),
            "wrap policy 'size_based' (plugin wrap_size_based): option wrap.min_num_params "
            "expects an integer of at least 1, got 'lots'");
}

TEST(PluginErrors, OutOfRangeOptionNamesTheComponentAndTheRange) {
  PluginHost host;
  host.load_file(size_based());
  EXPECT_EQ(error_of([&] { host.create<WrapPolicy>("size_based", {{"min_num_params", "0"}}); }),
            "wrap policy 'size_based' (plugin wrap_size_based): option wrap.min_num_params expects an integer of "
            "at least 1, got '0'");
}

TEST(PluginErrors, FactoryRefusalNamesTheComponent) {
  PluginHost host;
  host.load_file(fixture("good"));
  EXPECT_EQ(error_of([&] { host.create<WrapPolicy>("fixture_depth", {{"depth", "0"}}); }),
            "wrap policy 'fixture_depth' (plugin fixture_good): depth must be at least 1, got 0");
}

TEST(PluginErrors, WorldWritableDirectoryIsRefusedUnlessAllowed) {
  test::TempDir dir;
  fs::copy_file(fixture("good"), dir.path() / "good.so");
  ::chmod(dir.path().c_str(), 0777);
  {
    PluginHost host;
    EXPECT_EQ(error_of([&] { host.load_directory(dir.path(), /*allow_insecure=*/false); }),
              "refusing plugin directory " + dir.path().string() +
                  ": it is writable by others (mode 0777), and a plugin is code that runs with "
                  "your rights; make it private (chmod o-w " + dir.path().string() +
                  ") or pass --allow-insecure-plugin-dir to load from it anyway");
    EXPECT_TRUE(host.plugins().empty());
  }
  PluginHost host;
  EXPECT_TRUE(host.load_directory(dir.path(), /*allow_insecure=*/true).empty());
  EXPECT_EQ(host.plugins().size(), 1u);
}

TEST(PluginErrors, ABrokenPluginInADirectoryDoesNotStopTheOthers) {
  test::TempDir dir;
  fs::copy_file(fixture("good"), dir.path() / "a_good.so");
  fs::copy_file(fixture("wrong_torch"), dir.path() / "b_torch.so");
  PluginHost host;
  EXPECT_NE(error_of([&] { host.load_directory(dir.path(), false); }).find("b_torch.so: plugin 'fixture_torch'"),
            std::string::npos);
  PluginHost skipping;
  auto errors = skipping.load_directory(dir.path(), false, /*skip_broken=*/true);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("b_torch.so: plugin 'fixture_torch' was built against LibTorch 1.13.1"),
            std::string::npos)
      << errors[0];
  EXPECT_EQ(skipping.plugins().size(), 1u);
}

// --- Plugin loading is strict where the user was explicit --------------------------------------

using fsdpx::test::train;
const std::string kQuick = " --data.name synthetic --data.seq 16 --batch-size 2 --steps 1 ";

// A file named with --plugin must load: its failure stops the run with one line (it was a
// warning, and the run went on without it). So does a broken file of a folder scan, unless
// --skip-broken-plugins makes it a warning.
TEST(PluginErrors, ANamedPluginThatFailsStopsTheRun) {
  const fs::path p = fixture("wrong_torch");
  auto r = test::run_command(train() + kQuick + "--plugin " + p.string() + " --dry-run");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(r.err, "fsdpx-train: " + p.string() + ": plugin 'fixture_torch' was built against LibTorch 1.13.1, but "
                   "this host runs LibTorch 2.11.0; rebuild it against 2.11.0\n");
  PluginSearch search;
  search.files.push_back(p);
  PluginHost host;
  EXPECT_NE(error_of([&] { host.discover(search); }).find("was built against LibTorch 1.13.1"), std::string::npos);
  test::TempDir dir;
  fs::copy_file(p, dir.path() / "torch.so");
  auto scan = test::run_command(train() + kQuick + "--plugin-dir " + dir.path().string() + " --dry-run");
  EXPECT_EQ(scan.exit_code, 1) << scan.err;
  EXPECT_EQ(scan.err.rfind("fsdpx-train: " + (dir.path() / "torch.so").string(), 0), 0u) << scan.err;
  scan = test::run_command(train() + kQuick + "--plugin-dir " + dir.path().string() +
                           " --dry-run --skip-broken-plugins");
  EXPECT_EQ(scan.exit_code, 0) << scan.err;
  const std::string named = test::run_command(train() + kQuick + "--plugin " + p.string() +
                                              " --dry-run --skip-broken-plugins").err;
  EXPECT_NE(named.find("was built against LibTorch 1.13.1"), std::string::npos) << "a named file must still load";
  EXPECT_NE(scan.err.find("fsdpx-train: warning: " + (dir.path() / "torch.so").string()), std::string::npos)
      << scan.err;
}

// A component registered by two plugins is an error naming both files, in a folder scan too (the
// run took whichever loaded first).
TEST(PluginErrors, AComponentRegisteredTwiceInAFolderScanIsAnError) {
  test::TempDir dir;
  fs::copy_file(fixture("duplicate_component"), dir.path() / "dup.so");
  auto r = test::run_command(train() + kQuick + "--plugin-dir " + dir.path().string() + " --dry-run");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(r.err, "fsdpx-train: " + (dir.path() / "dup.so").string() + ": plugin 'fixture_duplicate_component' "
                   "registers wrap policy 'size_based', which plugin 'wrap_size_based' already registered from " +
                   size_based().string() + "; remove one of the two plugins\n");
  PluginHost host;
  host.load_file(size_based());
  EXPECT_NE(error_of([&] { host.load_directory(dir.path(), false); }).find("already registered"), std::string::npos);
}

// config.ini records --plugin-dir and --plugin (absolute), so that it reproduces a run that used
// a third party's plugins.
TEST(PluginErrors, ConfigIniRecordsThePluginFlagsAndReproducesTheRun) {
  test::TempDir dir;
  const fs::path folder = dir.path() / "plugins";
  fs::create_directories(folder);
  fs::copy_file(fixture("good"), folder / "good.so");
  const fs::path a = dir.path() / "a", b = dir.path() / "b";
  auto first = test::run_command("env -C " + dir.path().string() + " " + train() + kQuick +
                                 "--plugin-dir plugins --wrap.name fixture_depth --wrap.depth 2 --out " + a.string());
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string ini = test::read_file(a / "config.ini");
  EXPECT_NE(ini.find("\nplugin-dir=" + folder.string() + "\n"), std::string::npos) << ini;
  auto again = test::run_command(train() + " --config " + (a / "config.ini").string() + " --out " + b.string());
  EXPECT_EQ(again.exit_code, 0) << again.err;
  const std::string ini_b = test::read_file(b / "config.ini");
  EXPECT_NE(ini_b.find("\nplugin-dir=" + folder.string() + "\n"), std::string::npos) << ini_b;
  EXPECT_NE(ini_b.find("[wrap]\nname=fixture_depth\n"), std::string::npos) << ini_b;
}

}  // namespace
}  // namespace fsdpx
