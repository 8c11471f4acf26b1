// Compiled twice by tests/layout/check_layering.sh: as part of the engine layer, where the
// trainer's header must not be found (dependencies point down only), and as part of the trainer
// layer, where it must (so the failure is the layering, not this file).
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/trainer/trainer.h"

int fsdpx_layering_probe() { return 0; }
