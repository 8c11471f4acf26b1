// fsdpx/error.h: the one exception type fsdpx throws for bad input.
#pragma once

#include <stdexcept>
#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

// A user-facing error. what() is one complete sentence or clause that names what is wrong and,
// where there is one, what would be right. Hosts print it as is and exit non-zero.
class FSDPX_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message);
  ~Error() override;
};

// What a user reads of `e`: its what(), less the C++ stack trace that LibTorch's c10::Error
// appends to its message (a frame per line).
FSDPX_API std::string message_of(const std::exception& e);

}  // namespace fsdpx
