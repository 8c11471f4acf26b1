// fsdpx/component.h: the kinds of component a plugin can provide.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fsdpx/export.h"

namespace fsdpx {

// One kind per stable interface. The section name is the INI section and the command-line prefix
// of the kind's options: [wrap] name=size_based is the same as --wrap.name size_based.
enum class Kind {
  Sharding,    // fsdpx::ShardingStrategy   section "sharding"
  Wrap,        // fsdpx::WrapPolicy         section "wrap"
  Precision,   // fsdpx::PrecisionPolicy    section "precision"
  Optimizer,   // fsdpx::Optimizer          section "optimizer"
  Checkpoint,  // fsdpx::CheckpointBackend  section "checkpoint"
  Model,       // fsdpx::Model              section "model"
  Data,        // fsdpx::DataSource         section "data"
};

// All kinds, in the order above.
FSDPX_API const std::vector<Kind>& all_kinds();
// "sharding", "wrap", ...
FSDPX_API const char* section_name(Kind kind);
// "sharding strategy", "wrap policy", ... (for messages)
FSDPX_API const char* kind_title(Kind kind);
// The kind whose section is `section`, if any.
FSDPX_API std::optional<Kind> kind_from_section(const std::string& section);

}  // namespace fsdpx
