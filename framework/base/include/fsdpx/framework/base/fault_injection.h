// Fault injection for the tests of failure paths: the environment variable FSDPX_FAULT names one
// fault, POINT:RANK[:WHERE], that the code at that point on that global rank acts out. Read here
// alone; each point documents what it does:
//
//   inf-grad:R:STEP         the trainer: rank R finds an inf in its first gradient shard at STEP (from 1)
//   skip-all-gather:R:UNIT  the engine: rank R skips the first all-gather of UNIT ("root" for the root)
//   save-after-write:R      a sharded save: rank R exits abruptly after writing its file
//   save-during-write:R     a sharded save: rank R exits abruptly with its file half written (after
//                           the second part it wrote: in the background writer with async saves)
//   save-disk-full:R        a sharded save: rank R's writes fail as on a full disk (ENOSPC)
//   skip-offload-wait:R     the engine: rank R frees the first offloaded activations without the
//                           compute stream waiting for their copies to host memory (sim reports it)
//   slow-stage:R:MS         a background save: rank R sleeps MS milliseconds before staging each
//                           tensor (a slow copy that the next optimizer step must wait for)
#pragma once

#include <optional>
#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

// The fault FSDPX_FAULT names, parsed.
struct Fault {
  std::string point;  // "inf-grad", "skip-all-gather", ...
  int rank = -1;
  std::string where;  // what follows the rank ("" when nothing does)
};

// FSDPX_FAULT parsed, or nothing when it is unset or not of the form POINT:RANK[:WHERE] (RANK
// a non-negative decimal number).
FSDPX_API std::optional<Fault> requested_fault();

// Whether FSDPX_FAULT asks for `point` on `rank`, at `where` (compared whole; "" for a point that
// takes no WHERE).
FSDPX_API bool fault_requested(const std::string& point, int rank, const std::string& where = "");

}  // namespace fsdpx
