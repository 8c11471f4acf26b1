#include "fsdpx/component.h"

namespace fsdpx {

const std::vector<Kind>& all_kinds() {
  static const std::vector<Kind> kinds = {Kind::Sharding,   Kind::Wrap,  Kind::Precision,
                                          Kind::Optimizer,  Kind::Checkpoint, Kind::Model,
                                          Kind::Data};
  return kinds;
}

const char* section_name(Kind kind) {
  switch (kind) {
    case Kind::Sharding: return "sharding";
    case Kind::Wrap: return "wrap";
    case Kind::Precision: return "precision";
    case Kind::Optimizer: return "optimizer";
    case Kind::Checkpoint: return "checkpoint";
    case Kind::Model: return "model";
    case Kind::Data: return "data";
  }
  return "unknown";
}

const char* kind_title(Kind kind) {
  switch (kind) {
    case Kind::Sharding: return "sharding strategy";
    case Kind::Wrap: return "wrap policy";
    case Kind::Precision: return "precision policy";
    case Kind::Optimizer: return "optimizer";
    case Kind::Checkpoint: return "checkpoint backend";
    case Kind::Model: return "model";
    case Kind::Data: return "data source";
  }
  return "unknown component";
}

std::optional<Kind> kind_from_section(const std::string& section) {
  for (Kind k : all_kinds()) {
    if (section == section_name(k)) return k;
  }
  return std::nullopt;
}

}  // namespace fsdpx
