// Small helpers for the runtime: error messages, environment variables.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "fsdpx/framework/runtime/topology_resolver.h"

namespace fsdpx {

// The first line of an exception's message (c10::Error without its backtrace).
std::string first_line(const std::exception& e);
std::string seconds_text(std::chrono::milliseconds ms);  // "1.5 s"
std::string join_ints(const std::vector<int>& v);        // "0, 2, 3"
// `text` as a decimal integer; throws fsdpx::Error "<what>='<text>' is not an integer".
long long parse_integer(const std::string& text, const std::string& what);
// The variable `name` of `env`, if set and not empty.
std::optional<std::string> env_value(const Environment& env, const std::string& name);
// The same as an integer in [0, 2^30]; throws fsdpx::Error naming the variable otherwise.
std::optional<int> env_int(const Environment& env, const std::string& name);

// Set once a collective failed on this rank: the process groups then linger a little before
// tearing down, so that peers still diagnosing can read this rank's heartbeat (and, on rank 0,
// reach the store it serves).
std::atomic<bool>& failure_seen();

}  // namespace fsdpx
