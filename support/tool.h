// The small frame the benchmarks and the multi-process test workers share: a main that can
// launch itself on N local ranks, parses its options, and turns an exception into one line; the
// default plugins; the world's process groups from the environment.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <boost/program_options.hpp>

#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/runtime/process_groups.h"

namespace fsdpx::tool {

namespace po = boost::program_options;

// The main of program `name`: with --nproc-per-node N (and not already a worker) it runs N
// copies of itself and ends with their status; otherwise it parses the arguments against `desc`
// (plus --help, which prints `desc`), runs `body` and ends with its status. Any exception becomes
// "name: message" on stderr and status 1. It ends the process (fsdpx::exit_process): it does not
// return.
[[noreturn]] void main(int argc, char** argv, const std::string& name, po::options_description desc,
         const std::function<int(const po::variables_map&)>& body);

// A plugin host with the default plugins loaded; throws fsdpx::Error on any plugin that fails.
std::unique_ptr<PluginHost> default_plugins();

// Rendezvous of the ranks the environment describes (torchrun's variables, the launcher's or
// Slurm's), with the given timeouts; sets the intra-op threads as the trainer does (its share of the cores).
// `device`: the groups' tensors live there (DeviceKind::Sim or Cuda; Gloo is staged through host
// memory for sim).
std::shared_ptr<ProcessGroups> join_world(std::chrono::milliseconds rendezvous = std::chrono::seconds(60),
                                          std::chrono::milliseconds collectives = std::chrono::seconds(300),
                                          DeviceKind device = DeviceKind::Cpu, Backend backend = Backend::Default);

}  // namespace fsdpx::tool
