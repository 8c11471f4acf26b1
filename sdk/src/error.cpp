#include "fsdpx/error.h"

#include <c10/util/Exception.h>

namespace fsdpx {

Error::Error(const std::string& message) : std::runtime_error(message) {}
Error::~Error() = default;

std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace fsdpx
