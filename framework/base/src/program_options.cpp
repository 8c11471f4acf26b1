#include "fsdpx/framework/base/program_options.h"

#include <map>
#include <sstream>

#include "fsdpx/error.h"

namespace fsdpx {
namespace po = boost::program_options;

namespace {

// Every `from` in `text` replaced by `to`, the text put in never searched again.
std::string replace_all(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  size_t at = 0;
  for (size_t hit; !from.empty() && (hit = text.find(from, at)) != std::string::npos; at = hit + from.size())
    out.append(text, at, hit - at).append(to);
  return out.append(text, at, std::string::npos);
}

// A copy of a Boost error whose template and values (protected in Boost) can be read. Boost's
// ambiguous_option adds its alternatives in its own override; fsdpx parses without guessing, so
// its only ambiguity is an option registered twice, and the message names the option either way.
class ReadableError : public po::error_with_option_name {
 public:
  explicit ReadableError(const po::error_with_option_name& e) : po::error_with_option_name(e) {}

  // What Boost's what() would say: the defaults for missing values first, then each %key% once.
  std::string text() const {
    std::map<std::string, std::string> values = m_substitutions;
    values["canonical_option"] = get_canonical_option_name();
    values["prefix"] = get_canonical_option_prefix();
    std::string t = m_error_template;
    for (const auto& [key, texts] : m_substitution_defaults)
      if (values[key].empty()) t = replace_all(t, texts.first, texts.second);
    std::string out;
    for (size_t i = 0; i < t.size();) {
      const size_t end = t[i] == '%' ? t.find('%', i + 1) : std::string::npos;
      const auto it = end == std::string::npos ? values.end() : values.find(t.substr(i + 1, end - i - 1));
      if (it == values.end()) {
        out += t[i++];
      } else {
        out += it->second;
        i = end + 1;
      }
    }
    return out;
  }
};

}  // namespace

std::string option_error_text(const po::error& e) {
  if (const auto* named = dynamic_cast<const po::error_with_option_name*>(&e)) return ReadableError(*named).text();
  return e.what();
}

po::parsed_options parse_ini(const std::string& text, const po::options_description& desc, const std::string& origin) {
  std::istringstream in(text);
  try {
    return po::parse_config_file(in, desc, /*allow_unregistered=*/true);
  } catch (const po::error& e) {
    throw Error(origin + ": " + option_error_text(e));
  }
}

}  // namespace fsdpx
