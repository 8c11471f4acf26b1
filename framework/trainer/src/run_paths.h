// The paths of a run's settings, checked before any worker starts: inputs exist and are what they
// should be, and no output lies inside an input it would overwrite.
#pragma once

#include "fsdpx/framework/trainer/train_settings.h"

namespace fsdpx {

// --resume DIR is a directory, --init-from a file or a directory; --out is (or will be) a
// directory lying inside neither; --save-init, which replaces its directory as a whole, holds
// neither. Throws fsdpx::Error naming the option and the path.
void check_run_paths(const TrainSettings& s);

}  // namespace fsdpx
