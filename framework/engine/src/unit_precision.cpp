#include "fsdpx/framework/engine/unit_precision.h"

#include "fsdpx/error.h"
#include "fsdpx/framework/base/dtype_name.h"

namespace fsdpx {

void check_unit_precision(const std::string& fqn, const PrecisionSpec& unit, const PrecisionSpec& root) {
  if (unit.storage == root.storage && unit.gradient == root.gradient) return;
  throw Error("the precision policy stores unit '" + fqn + "' in " + dtype_name(unit.storage) + " with " +
              dtype_name(unit.gradient) + " gradients, the root in " + dtype_name(root.storage) + " with " +
              dtype_name(root.gradient) + "; units may differ in compute and reduce dtypes only");
}

}  // namespace fsdpx
