// The run configuration: an INI file (the input up to a line "--", if any) and command-line
// arguments (the lines after it), resolved against the installed plugins as fsdpx-train does.
#include <sstream>

#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/trainer/train_settings.h"
#include "fsdpx/framework/trainer/trainer.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t cut = text.find("\n--\n");
  const std::string ini = text.substr(0, cut);
  std::vector<std::string> args;
  if (cut != std::string::npos) {
    std::istringstream in(text.substr(cut + 4));
    for (std::string line; std::getline(in, line);) args.push_back(line);
  }
  const auto file = fsdpx::fuzz::write("run.ini", reinterpret_cast<const uint8_t*>(ini.data()), ini.size());
  args.insert(args.begin(), {"--config", file.string()});
  static const auto host_options = fsdpx::TrainSettings::options();
  fsdpx::fuzz::expect_clear_errors([&] {
    fsdpx::ConfigRequest req{&host_options, fsdpx::default_components(), {fsdpx::Kind::Checkpoint}};
    fsdpx::RunConfig config = fsdpx::RunConfig::resolve(fsdpx::fuzz::plugins(), args, req);
    fsdpx::TrainSettings::from(config.host_values());
    config.to_ini();
  });
  return 0;
}
