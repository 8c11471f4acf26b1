// Outputs that never destroy inputs: an output is checked before anything is written (not inside
// what it reads, not a symlink, a device or a directory where a file belongs), written under a
// temporary name of its own, and renamed into place only when complete; a failure removes the
// temporary.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fsdpx/export.h"

namespace fsdpx {

// An input as messages name it: {"the checkpoint", "runs/x/checkpoints/step-00000010"}.
using NamedPath = std::pair<std::string, std::string>;

// Whether `path` is `container` or lies inside it, both resolved through the symlinks that exist.
FSDPX_API bool lies_within(const std::string& path, const std::string& container);

// Checks output file `out`, which `what` names ("the output"), before anything is written: it
// is absent or a regular file (not a symlink, a directory, a device, a FIFO or a socket), its
// directory exists, and it is none of `inputs` and lies inside none of them. Throws fsdpx::Error
// naming both.
FSDPX_API void check_output_file(const std::string& out, const std::string& what, const std::vector<NamedPath>& inputs);
// The same for an output directory that is written aside and renamed into place: absent or an
// empty directory (not a symlink), its parent exists, and it neither holds nor lies inside an input.
FSDPX_API void check_output_dir(const std::string& out, const std::string& what, const std::vector<NamedPath>& inputs);

// A temporary file or directory beside `out` (OUT.tmp-PID), removed when the object goes unless
// commit() renamed it onto `out`.
class FSDPX_API TempOutput {
 public:
  explicit TempOutput(std::string out);
  ~TempOutput();
  TempOutput(const TempOutput&) = delete;
  TempOutput& operator=(const TempOutput&) = delete;
  const std::string& path() const { return tmp_; }
  // Renames the temporary onto `out` (an empty directory there is replaced). Throws fsdpx::Error
  // naming `out`; the temporary is removed then too.
  void commit();

 private:
  std::string out_, tmp_;
  bool committed_ = false;
};

}  // namespace fsdpx
