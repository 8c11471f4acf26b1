// Text for the runtime's messages: an exception's first line, seconds, a list of ranks.
#include "message_text.h"

#include <sstream>

#include <c10/util/Exception.h>

namespace fsdpx {

std::string first_line(const std::exception& e) {
  std::string what;
  if (auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    what = c10->what_without_backtrace();
  } else {
    what = e.what();
  }
  auto nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream s;
  s << static_cast<double>(ms.count()) / 1000.0 << " s";
  return s.str();
}

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return out;
}

}  // namespace fsdpx
