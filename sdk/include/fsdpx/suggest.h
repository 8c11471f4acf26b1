// fsdpx/suggest.h: closest-name suggestions for error messages ("did you mean ...?"), as the host
// gives them; a plugin naming what it accepts may give them too.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fsdpx/export.h"

namespace fsdpx {

// The one candidate that `name` is a dotted prefix of, or that is a dotted prefix of `name`
// ("output" and "output.weight": a name moved into a module, or out of one); none when no
// candidate or several are.
FSDPX_API std::optional<std::string> moved_name(const std::string& name,
                                                const std::vector<std::string>& candidates);

// moved_name's candidate if there is one; else the candidate closest to `name` by edit distance,
// if it is close enough to be a likely typo (distance at most max(2, longer length / 3)).
FSDPX_API std::optional<std::string> closest_name(const std::string& name,
                                                  const std::vector<std::string>& candidates);

// "; did you mean 'x'?" or "".
FSDPX_API std::string did_you_mean(const std::string& name,
                                   const std::vector<std::string>& candidates);

// "a, b, c" or "(none)".
FSDPX_API std::string join_names(const std::vector<std::string>& names);
// `names` without repeats (exact matches), in the order they first appear.
FSDPX_API std::vector<std::string> distinct(const std::vector<std::string>& names);

}  // namespace fsdpx
