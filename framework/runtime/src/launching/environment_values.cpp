// Environment variables read as values: integers checked, empty ones treated as unset.
#include "environment_values.h"

#include <cerrno>
#include <cstdlib>

#include "fsdpx/error.h"

namespace fsdpx {

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

}  // namespace fsdpx
