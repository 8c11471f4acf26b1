#include "fsdpx/framework/runtime/collective_context.h"

namespace fsdpx {

namespace {
thread_local const char* t_phase = nullptr;
thread_local const std::string* t_unit = nullptr;
}  // namespace

CollectivePhase::CollectivePhase(const char* phase) : saved_(t_phase) { t_phase = phase; }
CollectivePhase::~CollectivePhase() { t_phase = saved_; }
const char* CollectivePhase::current() { return t_phase ? t_phase : "other"; }

CollectiveUnit::CollectiveUnit(const std::string& unit) : saved_(t_unit) { t_unit = &unit; }
CollectiveUnit::~CollectiveUnit() { t_unit = saved_; }
const std::string& CollectiveUnit::current() {
  static const std::string none;
  return t_unit ? *t_unit : none;
}

}  // namespace fsdpx
