// Text for the runtime's messages: an exception's first line, seconds, a list of ranks.
#pragma once

#include <chrono>
#include <exception>
#include <string>
#include <vector>

namespace fsdpx {

// The first line of an exception's message (c10::Error without its backtrace).
std::string first_line(const std::exception& e);
std::string seconds_text(std::chrono::milliseconds ms);  // "1.5 s"
std::string join_ints(const std::vector<int>& v);        // "0, 2, 3"

}  // namespace fsdpx
