#include "fsdpx/suggest.h"

#include <algorithm>
#include <cstdint>

namespace fsdpx {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Whether `inner` is `outer` up to one of its dots ("output" and "output.weight"): a name that
// became a module's, or the reverse.
bool dotted_prefix(const std::string& inner, const std::string& outer) {
  return outer.size() > inner.size() && outer.compare(0, inner.size(), inner) == 0 && outer[inner.size()] == '.';
}

}  // namespace

std::optional<std::string> moved_name(const std::string& name, const std::vector<std::string>& candidates) {
  std::optional<std::string> found;
  for (const auto& c : candidates)
    if (dotted_prefix(name, c) || dotted_prefix(c, name)) {
      if (found) return std::nullopt;  // several: none is the one
      found = c;
    }
  return found;
}

std::optional<std::string> closest_name(const std::string& name,
                                        const std::vector<std::string>& candidates) {
  if (auto moved = moved_name(name, candidates)) return moved;
  std::optional<std::string> best;
  size_t best_distance = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = edit_distance(name, c);
    if (d <= std::max<size_t>(2, std::max(name.size(), c.size()) / 3) && d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates) {
  auto best = closest_name(name, candidates);
  return best ? "; did you mean '" + *best + "'?" : "";
}

std::string join_names(const std::vector<std::string>& names) {
  if (names.empty()) return "(none)";
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<std::string> distinct(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& n : names)
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  return out;
}

}  // namespace fsdpx
