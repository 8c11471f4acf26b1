#include "tool.h"

#include <cstdio>
#include <iostream>

#include <ATen/Parallel.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/base/program_options.h"
#include "fsdpx/framework/runtime/cpu_resources.h"
#include "fsdpx/framework/runtime/launcher.h"
#include "fsdpx/framework/runtime/topology_resolver.h"

namespace fsdpx::tool {

namespace {

int run(int argc, char** argv, const std::string& name, po::options_description desc,
        const std::function<int(const po::variables_map&)>& body) {
  fork_workers_early(argc, argv);  // with --nproc-per-node: each worker goes on from here
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    std::vector<std::string> args;
    if (auto rc = launch_if_requested(argc, argv, name, args)) return *rc;
    desc.add_options()("help,h", "this help");
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    return body(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", name.c_str(), option_error_text(e).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), message_of(e).c_str());
    return 1;
  }
}

}  // namespace

void main(int argc, char** argv, const std::string& name, po::options_description desc,
          const std::function<int(const po::variables_map&)>& body) {
  exit_process(run(argc, argv, name, std::move(desc), body));
}

std::unique_ptr<PluginHost> default_plugins() {
  auto host = std::make_unique<PluginHost>();
  for (const auto& e : host->discover(PluginSearch{})) throw Error(e);
  return host;
}

std::shared_ptr<ProcessGroups> join_world(std::chrono::milliseconds rendezvous, std::chrono::milliseconds collectives,
                                          DeviceKind device, Backend backend) {
  RuntimeOptions ro;
  ro.device = device;
  ro.backend = backend;
  ro.topology = resolve_topology({}, process_environment()).topology;
  // The trainer's threads per rank (its share of the cores), so that ranks of one node do not
  // oversubscribe them.
  at::set_num_threads(choose_threads(process_environment(), ro.topology.local_world_size, affinity_cpus()).threads);
  ro.rendezvous_timeout = rendezvous;
  ro.collective_timeout = collectives;
  return ProcessGroups::create(ro);
}

}  // namespace fsdpx::tool
