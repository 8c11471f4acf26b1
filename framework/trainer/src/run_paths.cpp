#include "run_paths.h"

#include <string>

#include "fsdpx/error.h"
#include "fsdpx/files.h"
#include "fsdpx/framework/checkpoint/output_paths.h"

namespace fsdpx {

void check_run_paths(const TrainSettings& s) {
  const std::string resume = s.resume == "auto" ? "" : s.resume;
  if (!resume.empty()) {
    const std::string kind = file_kind(resume);
    if (kind == "missing")
      throw Error("--resume " + resume + " does not exist; give a checkpoint directory (step-NNNNNNNN) or auto");
    if (kind != "a directory")
      throw Error("--resume " + resume + " is " + (kind.empty() ? "a file" : kind) + ", not a checkpoint directory");
  }
  if (!s.init_from.empty()) {
    const std::string kind = file_kind(s.init_from);
    if (kind == "missing")
      throw Error("--init-from " + s.init_from + " does not exist; give a safetensors file, or a directory holding "
                  "model.safetensors");
    if (!kind.empty() && kind != "a directory")
      throw Error("--init-from " + s.init_from + " is " + kind + ", not a file or a directory");
  }
  const std::vector<NamedPath> inputs = {{"--resume", resume}, {"--init-from", s.init_from}};
  if (!s.out_dir.empty()) {
    const std::string kind = file_kind(s.out_dir);
    if (kind != "missing" && kind != "a directory")
      throw Error("--out " + s.out_dir + " is " + (kind.empty() ? "a file" : kind) +
                  ", not a directory; give a directory for the run's files");
    for (const auto& [name, in] : inputs)
      if (!in.empty() && lies_within(s.out_dir, in))
        throw Error("--out " + s.out_dir + " lies inside " + name + " " + in +
                    ", which the run reads; put it elsewhere");
  }
  if (!s.save_init.empty())
    for (const auto& [name, in] : inputs)
      if (!in.empty() && lies_within(in, s.save_init))
        throw Error("--save-init " + s.save_init + " holds " + name + " " + in + ", and the save replaces the whole "
                    "directory; give another --save-init");
}

}  // namespace fsdpx
