// fsdpx-train's command line: every option it takes, which of them only the command line may
// give, and the combinations it refuses before any worker starts. fsdpx-train and the fuzz target
// of its --dry-run path (tests/fuzz/fuzz_train_command.cpp) share them.
#pragma once

#include <boost/program_options/options_description.hpp>
#include <boost/program_options/variables_map.hpp>

#include "fsdpx/export.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/framework/runtime/topology_resolver.h"

namespace fsdpx {

// Every option of fsdpx-train: TrainSettings::options() (also top-level keys of --config), then
// the topology, action and plugin flags. Every numeric one declares its range (host_options.h).
FSDPX_API boost::program_options::options_description train_command_options();

// fsdpx-train's request to RunConfig::resolve: `options`, the default components, a run without
// a checkpoint on request, and the flags that only the command line may give (the launcher's
// --nproc-per-node, the actions, --allow-insecure-plugin-dir): an INI file holding one is refused.
FSDPX_API ConfigRequest train_config_request(const boost::program_options::options_description& options);

// Refuses, with one line naming both, what cannot go together: two actions (--dry-run,
// --check-comm, --print-topology); the local launcher (`nproc_per_node` > 0) with a flag that
// places ranks (--rank, --world-size, ...: the launcher sets them); checkpoint flags (--save-every,
// --keep-last, --resume) without a checkpoint component; --save-init with --resume DIR (the run
// would start from the checkpoint, not from what --save-init writes).
FSDPX_API void check_train_flags(const RunConfig& config, int nproc_per_node);

// --device: cpu, cuda or sim. Throws fsdpx::Error naming another value.
FSDPX_API DeviceKind device_of(const HostValues& vm);
// --backend: default, gloo, or nccl (with --device cuda only). Throws fsdpx::Error naming another value.
FSDPX_API Backend backend_of(const HostValues& vm);

// The topology flags (--rank, ..., --master-port) as given.
FSDPX_API TopologyFlags topology_flags(const HostValues& vm);

// The runtime's options from fsdpx-train's flags (device, backend, timeouts, --check-collectives,
// --watch-peers; a rank that fails ends the others), with `topology`. Read by the launcher too,
// before any worker starts, so that every flag is read where the run is planned.
FSDPX_API RuntimeOptions runtime_options(const HostValues& vm, const Topology& topology);

}  // namespace fsdpx
