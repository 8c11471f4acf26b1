// Boost.Program_options as fsdpx uses it: an INI file's text parsed, and an error's message.
#pragma once

#include <string>

#include <boost/program_options/errors.hpp>
#include <boost/program_options/options_description.hpp>
#include <boost/program_options/parsers.hpp>

#include "fsdpx/export.h"

namespace fsdpx {

// The message of a Boost.Program_options error, each placeholder ("%value%", "%invalid_line%")
// filled in once. Boost's own what() fills them in a loop that never ends when the text put in
// holds the placeholder itself (a value "1%value%", an INI line "%invalid_line%"; both found by
// tests/fuzz/fuzz_config), so fsdpx turns these errors into text only here.
FSDPX_API std::string option_error_text(const boost::program_options::error& e);

// An INI file's text as Boost reads it ("[model]" then "size = tiny" gives "model.size"), keys
// that `desc` does not register kept. A line it cannot read throws fsdpx::Error "ORIGIN: why".
FSDPX_API boost::program_options::parsed_options parse_ini(const std::string& text,
                                                           const boost::program_options::options_description& desc,
                                                           const std::string& origin);

}  // namespace fsdpx
