// fsdpx-train's command line and INI file through its option parsing, the checks made before any
// worker starts, and planning: the --dry-run path (hosts/fsdpx-train/main.cpp). The input is an
// INI file up to a line "--", then command-line arguments, one per line. Plugins are the build's
// own: files the input names are never loaded (plugin_search only reads them).
#include <sstream>

#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/runtime/launcher.h"
#include "fsdpx/framework/trainer/run_plan.h"
#include "fsdpx/framework/trainer/train_command.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t cut = text.find("\n--\n");
  const std::string ini = text.substr(0, cut);
  std::vector<std::string> args = {"fsdpx-train"};
  if (cut != std::string::npos) {
    std::istringstream in(text.substr(cut + 4));
    for (std::string line; std::getline(in, line);) args.push_back(line);
  }
  const auto file = fsdpx::fuzz::write("train.ini", reinterpret_cast<const uint8_t*>(ini.data()), ini.size());
  args.insert(args.begin() + 1, {"--config", file.string()});
  static const auto options = fsdpx::train_command_options();
  fsdpx::fuzz::expect_clear_errors([&] {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    const fsdpx::LauncherArgs la = fsdpx::split_launcher_args(static_cast<int>(argv.size()), argv.data());
    const std::vector<std::string> plain(la.rest.begin() + 1, la.rest.end());
    fsdpx::plugin_search(plain);
    const fsdpx::RunConfig config = fsdpx::RunConfig::resolve(fsdpx::fuzz::plugins(), plain,
                                                              fsdpx::train_config_request(options));
    fsdpx::check_train_flags(config, la.nproc_per_node);
    const fsdpx::TrainSettings settings = fsdpx::TrainSettings::from(config.host_values());
    fsdpx::Topology topology;
    if (la.nproc_per_node > 0) {
      topology.world_size = topology.local_world_size = la.nproc_per_node;
    } else {  // flags alone: the fuzzer's environment must not decide
      topology = fsdpx::resolve_topology(fsdpx::topology_flags(config.host_values()), {}).topology;
    }
    const fsdpx::RunPlan plan = fsdpx::plan_run(fsdpx::fuzz::plugins(), config, settings, topology);
    (void)plan.text();
    (void)config.to_ini();
  });
  return 0;
}
