#include "components.h"

#include "fsdpx/capabilities.h"

namespace fsdpx {

const ComponentChoice& chosen(const RunConfig& config, Kind kind) {
  const ComponentChoice* c = config.choice(kind);
  if (!c)
    throw Error(std::string("no ") + section_name(kind) + " component chosen; give --" + section_name(kind) +
                ".name NAME");
  return *c;
}

bool runs_on_cpu(const Optimizer& opt) {
  const auto* d = dynamic_cast<const OptimizerDevices*>(&opt);
  return !d || d->runs_on_cpu();
}

}  // namespace fsdpx
