// The plugin host on good plugins: discovery order, loading, creating components, lifetime.
#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/wrap_policy.h"
#include "test_paths.h"

namespace fsdpx {
namespace {
namespace fs = std::filesystem;

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) ::unsetenv(name_);
    else ::setenv(name_, old_.c_str(), 1);
  }

 private:
  const char* name_;
  std::string old_;
};

TEST(PluginHost, DefaultDirectoryIsBesideLibfsdpx) {
  EXPECT_EQ(fs::canonical(PluginHost::default_plugin_dir()), fs::canonical(test::plugin_dir()));
}

TEST(PluginHost, GoodPluginLoadsAndItsComponentIsCreated) {
  PluginHost host;
  host.load_file(test::fixture("good"));
  ASSERT_EQ(host.plugins().size(), 1u);
  const PluginRecord& p = *host.plugins()[0];
  EXPECT_EQ(p.name, "fixture_good");
  EXPECT_EQ(p.version, "1.2.3");
  EXPECT_EQ(p.torch_version, "2.11.0");
  const ComponentRecord& c = host.find(Kind::Wrap, "fixture_depth");
  EXPECT_EQ(c.spec.options.size(), 2u);

  auto policy = host.create<WrapPolicy>("fixture_depth", {{"depth", "2"}, {"recompute", "yes"}});
  torch::nn::Module model;
  model.register_module("0", torch::nn::Sequential(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2)));
  model.register_module("1", torch::nn::Linear(2, 3));
  auto units = policy->select(model);
  ASSERT_EQ(units.size(), 2u);
  EXPECT_EQ(units[0].fqn, "0.0");
  EXPECT_EQ(units[1].fqn, "0.1");
  EXPECT_TRUE(units[0].activation_checkpoint);
}

TEST(PluginHost, ObjectsKeepTheirLibraryAlive) {
  std::shared_ptr<WrapPolicy> policy;
  std::weak_ptr<PluginLibrary> library;
  {
    PluginHost host;
    host.load_file(test::fixture("good"));
    library = host.plugins()[0]->library;
    policy = host.create<WrapPolicy>("fixture_depth");
  }
  // The host is gone; the object still holds its library, and its code still runs.
  EXPECT_FALSE(library.expired());
  torch::nn::Sequential model(torch::nn::Linear(2, 2));
  EXPECT_EQ(policy->select(*model).size(), 1u);
  policy.reset();
  EXPECT_TRUE(library.expired());
}

TEST(PluginHost, SameFileTwiceLoadsOnce) {
  PluginHost host;
  host.load_file(test::fixture("good"));
  host.load_file(test::fixture_dir() / "." / "fixture_good.so");
  EXPECT_EQ(host.plugins().size(), 1u);
}

TEST(PluginHost, DiscoveryOrderDefaultThenEnvironmentThenFlags) {
  test::TempDir env_dir, flag_dir;
  fs::copy_file(test::fixture("good"), env_dir.path() / "good.so");
  fs::copy_file(test::fixture("good_copy"), flag_dir.path() / "good_copy.so");
  ScopedEnv env("FSDPX_PLUGIN_PATH", env_dir.path().string() + ":");
  PluginHost host;
  PluginSearch search;
  search.dirs.push_back(flag_dir.path());
  auto found = host.discover_all(search);
  // The default directory has wrap_size_based; the environment's copy of fixture_good wins
  // over the flag's, which is then a duplicate naming both files: an error, not a warning.
  EXPECT_TRUE(found.warnings.empty());
  ASSERT_EQ(found.errors.size(), 1u);
  EXPECT_EQ(found.errors[0], (flag_dir.path() / "good_copy.so").string() +
                           ": plugin 'fixture_good' is already loaded from " +
                           (env_dir.path() / "good.so").string() + "; remove one of the two copies");
  EXPECT_EQ(host.find(Kind::Wrap, "size_based").plugin->path.parent_path(),
            PluginHost::default_plugin_dir());
  EXPECT_EQ(host.find(Kind::Wrap, "fixture_depth").plugin->path, env_dir.path() / "good.so");
}

TEST(PluginHost, EnvironmentNamingAMissingDirectoryIsReported) {
  ScopedEnv env("FSDPX_PLUGIN_PATH", "/nonexistent/plugins");
  PluginHost host;
  PluginSearch search;
  search.default_dir = false;
  EXPECT_EQ(test::error_of([&] { host.discover(search); }),
            "FSDPX_PLUGIN_PATH names /nonexistent/plugins, which is not a directory (fix FSDPX_PLUGIN_PATH, or pass "
            "--skip-broken-plugins)");
  search.skip_broken = true;
  auto warnings = host.discover(search);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "FSDPX_PLUGIN_PATH names /nonexistent/plugins, which is not a directory");
}

TEST(PluginHost, ComponentsAreListedByKindThenName) {
  PluginHost host;
  host.load_file(test::fixture("good"));
  host.load_file(test::plugin_dir() / "wrap_size_based.so");
  auto all = host.components();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0]->spec.name, "fixture_depth");
  EXPECT_EQ(all[1]->spec.name, "size_based");
  EXPECT_EQ(all[1]->title(), "wrap policy 'size_based' (plugin wrap_size_based)");
}

}  // namespace
}  // namespace fsdpx
