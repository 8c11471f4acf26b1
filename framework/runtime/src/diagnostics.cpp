#include "diagnostics.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include <c10/util/Exception.h>

#include "fsdpx/error.h"

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

long long parse_integer(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0') throw Error(what + "='" + text + "' is not an integer");
  return v;
}

std::optional<std::string> env_value(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

std::optional<int> env_int(const Environment& env, const std::string& name) {
  auto v = env_value(env, name);
  if (!v) return std::nullopt;
  long long n = parse_integer(*v, name);
  if (n < 0 || n > 1 << 30) throw Error(name + "=" + *v + " is out of range");
  return static_cast<int>(n);
}

std::atomic<bool>& failure_seen() {
  static std::atomic<bool> seen{false};
  return seen;
}

}  // namespace fsdpx
