// Environment variables read as values: integers checked, empty ones treated as unset.
#pragma once

#include <optional>
#include <string>

#include "fsdpx/framework/runtime/topology_resolver.h"  // Environment

namespace fsdpx {

// `text` as a decimal integer; throws fsdpx::Error "<what>='<text>' is not an integer".
long long parse_integer(const std::string& text, const std::string& what);
// The variable `name` of `env`, if set and not empty.
std::optional<std::string> env_value(const Environment& env, const std::string& name);
// The same as an integer in [0, 2^30]; throws fsdpx::Error naming the variable otherwise.
std::optional<int> env_int(const Environment& env, const std::string& name);

}  // namespace fsdpx
