// libfsdpx_sim.so (devices/sim), which libfsdpx loads only when a run asks for --device sim.
#pragma once

namespace fsdpx {

// Loads it once: from FSDPX_SIM_LIBRARY, else from beside libfsdpx. Throws fsdpx::Error naming the
// path and the loader's reason when it does not load.
void load_sim();

}  // namespace fsdpx
