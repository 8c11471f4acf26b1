// What the collectives issued on this thread are for: the phase of the step and the unit. The
// flight recorder keeps both with every collective, and --check-collectives compares them across
// ranks. Set by scope; scopes nest and restore what was there before.
#pragma once

#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

// "forward", "backward", "step", "checkpoint", ...; a string literal (kept by pointer).
class FSDPX_API CollectivePhase {
 public:
  explicit CollectivePhase(const char* phase);
  ~CollectivePhase();
  CollectivePhase(const CollectivePhase&) = delete;
  CollectivePhase& operator=(const CollectivePhase&) = delete;
  static const char* current();  // "other" outside any scope

 private:
  const char* saved_;
};

// The unit's name ("layers.3", "root"); `unit` must outlive the scope.
class FSDPX_API CollectiveUnit {
 public:
  explicit CollectiveUnit(const std::string& unit);
  // Only a reference is kept, so a temporary would dangle before the first collective.
  explicit CollectiveUnit(std::string&&) = delete;
  explicit CollectiveUnit(const char*) = delete;
  ~CollectiveUnit();
  CollectiveUnit(const CollectiveUnit&) = delete;
  CollectiveUnit& operator=(const CollectiveUnit&) = delete;
  static const std::string& current();  // "" outside any scope

 private:
  const std::string* saved_;
};

}  // namespace fsdpx
