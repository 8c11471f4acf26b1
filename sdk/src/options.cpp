#include "fsdpx/options.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>

#include "fsdpx/error.h"
#include "fsdpx/optimizer.h"
#include "fsdpx/suggest.h"

namespace fsdpx {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::string format_double(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

constexpr int64_t kIntMin = std::numeric_limits<int64_t>::min(), kIntMax = std::numeric_limits<int64_t>::max();

const char* expectation(OptionType t) {
  switch (t) {
    case OptionType::Bool: return "a boolean (true/false, yes/no, on/off, 1/0)";
    case OptionType::Int: return "an integer";
    case OptionType::Float: return "a finite number";
    case OptionType::String: return "text";
    case OptionType::Choice: return "one of its choices";
    case OptionType::List: return "a comma-separated list";
  }
  return "a value";
}

// "[1" / "65536]", "(0" / "inf]": the two items of OptionSpec::choices that carry a range.
std::vector<std::string> range_items(const std::string& lo, bool lo_open, const std::string& hi, bool hi_open) {
  return {(lo_open ? "(" : "[") + lo, hi + (hi_open ? ")" : "]")};
}

[[noreturn]] void malformed_range(const OptionSpec& spec) {
  throw Error("option '" + spec.name + "' declares a malformed range (a bug in the plugin)");
}

// One end of a range as text and whether it is open ("[1" gives 1, closed); throws on a malformed item.
std::pair<std::string, bool> range_end(const OptionSpec& spec, const std::string& item, bool lower) {
  if (item.size() < 2) malformed_range(spec);
  if (lower && (item[0] == '[' || item[0] == '(')) return {item.substr(1), item[0] == '('};
  if (!lower && (item.back() == ']' || item.back() == ')'))
    return {item.substr(0, item.size() - 1), item.back() == ')'};
  malformed_range(spec);
}

bool number_ok(const std::string& text, int64_t& v) {
  auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  return !text.empty() && res.ec == std::errc() && res.ptr == text.data() + text.size();
}

bool number_ok(const std::string& text, double& v) {
  if (text == "inf" || text == "-inf") {
    v = text == "inf" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    return true;
  }
  auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  return !text.empty() && res.ec == std::errc() && res.ptr == text.data() + text.size();
}

std::string int_expectation(const IntRange& r) {
  if (r.min == kIntMin && r.max == kIntMax) return "an integer";
  if (r.max == kIntMax) return "an integer of at least " + std::to_string(r.min);
  if (r.min == kIntMin) return "an integer of at most " + std::to_string(r.max);
  return "an integer in [" + std::to_string(r.min) + ", " + std::to_string(r.max) + "]";
}

// A range's end for people: whole numbers as integers (10000000, not 1e+07).
std::string end_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return format_double(v);
}

std::string float_expectation(const FloatRange& r) {
  const bool lo = std::isfinite(r.min), hi = std::isfinite(r.max);
  if (!lo && !hi) return "a finite number";
  if (!hi) return std::string("a number ") + (r.min_open ? "greater than " : "of at least ") + end_text(r.min);
  if (!lo) return std::string("a number ") + (r.max_open ? "less than " : "of at most ") + end_text(r.max);
  return std::string("a number in ") + (r.min_open ? "(" : "[") + end_text(r.min) + ", " + end_text(r.max) +
         (r.max_open ? ")" : "]");
}

bool in_range(const FloatRange& r, double v) {
  return (r.min_open ? v > r.min : v >= r.min) && (r.max_open ? v < r.max : v <= r.max);
}

// Parses `text` as `spec` says. Returns the value and its canonical text, or throws with `where`.
std::pair<Options::Value, std::string> parse_value(const std::string& where, const OptionSpec& spec,
                                                   const std::string& raw) {
  const std::string text = trim(raw);
  auto bad = [&](const std::string& extra = "") -> Error {
    return Error(where + " expects " + expected_value(spec) + ", got '" + raw + "'" + extra);
  };
  switch (spec.type) {
    case OptionType::Bool: {
      std::string t = lower(text);
      if (t == "true" || t == "1" || t == "yes" || t == "on") return {true, "true"};
      if (t == "false" || t == "0" || t == "no" || t == "off") return {false, "false"};
      throw bad();
    }
    case OptionType::Int: {
      int64_t v = 0;
      const char* first = text.data() + (!text.empty() && text[0] == '+' ? 1 : 0);
      const char* last = text.data() + text.size();
      if (first != text.data() && first < last && *first == '-') throw bad();
      auto res = std::from_chars(first, last, v);
      if (text.empty() || res.ec == std::errc::result_out_of_range)
        throw bad(res.ec == std::errc::result_out_of_range ? " (out of the 64-bit range)" : "");
      if (res.ec != std::errc() || res.ptr != last) throw bad();
      if (auto r = int_range(spec); r && (v < r->min || v > r->max)) throw bad();
      return {v, std::to_string(v)};
    }
    case OptionType::Float: {
      double v = 0;
      const char* first = text.data() + (!text.empty() && text[0] == '+' ? 1 : 0);
      const char* last = text.data() + text.size();
      if (first != text.data() && first < last && *first == '-') throw bad();
      auto res = std::from_chars(first, last, v);
      if (text.empty() || res.ec != std::errc() || res.ptr != last || !std::isfinite(v)) throw bad();
      if (auto r = float_range(spec); r && !in_range(*r, v)) throw bad();
      return {v, format_double(v)};
    }
    case OptionType::String:
      // An INI file cannot hold these (Boost cuts at '#', lines end at newlines, values are
      // trimmed), and the resolved configuration must reproduce the run.
      if (raw.find_first_of("#\n") != std::string::npos || raw != trim(raw))
        throw Error(where + " cannot hold '#', a newline, or leading/trailing spaces (an INI file "
                    "could not reproduce it), got '" + raw + "'");
      return {raw, raw};
    case OptionType::Choice: {
      if (std::find(spec.choices.begin(), spec.choices.end(), text) == spec.choices.end())
        throw Error(where + " expects one of " + join_names(spec.choices) + ", got '" + raw + "'" +
                    did_you_mean(text, spec.choices));
      return {text, text};
    }
    case OptionType::List: {
      std::vector<std::string> items;
      std::string canonical;
      size_t start = 0;
      while (start <= text.size()) {
        size_t comma = text.find(',', start);
        if (comma == std::string::npos) comma = text.size();
        std::string item = trim(text.substr(start, comma - start));
        if (!item.empty()) {
          canonical += (items.empty() ? "" : ",") + item;
          items.push_back(item);
        }
        start = comma + 1;
      }
      return {items, canonical};
    }
  }
  throw bad();
}

// The prefix of Options::given_'s read marks: no option name holds ':'.
constexpr const char* kReadMark = "read:";

OptionSpec make(std::string name, OptionType type, std::string def, std::string help) {
  return OptionSpec{std::move(name), type, std::move(def), std::move(help), {}};
}

}  // namespace

const char* type_name(OptionType type) {
  switch (type) {
    case OptionType::Bool: return "bool";
    case OptionType::Int: return "int";
    case OptionType::Float: return "float";
    case OptionType::String: return "string";
    case OptionType::Choice: return "choice";
    case OptionType::List: return "list";
  }
  return "?";
}

OptionSpec flag_option(std::string name, bool default_value, std::string help) {
  return make(std::move(name), OptionType::Bool, default_value ? "true" : "false", std::move(help));
}
OptionSpec int_option(std::string name, int64_t default_value, std::string help) {
  return make(std::move(name), OptionType::Int, std::to_string(default_value), std::move(help));
}
OptionSpec float_option(std::string name, double default_value, std::string help) {
  return make(std::move(name), OptionType::Float, format_double(default_value), std::move(help));
}
OptionSpec string_option(std::string name, std::string default_value, std::string help) {
  return make(std::move(name), OptionType::String, std::move(default_value), std::move(help));
}
OptionSpec choice_option(std::string name, std::string default_value,
                         std::vector<std::string> choices, std::string help) {
  OptionSpec s = make(std::move(name), OptionType::Choice, std::move(default_value), std::move(help));
  s.choices = std::move(choices);
  return s;
}
OptionSpec list_option(std::string name, std::string default_value, std::string help) {
  return make(std::move(name), OptionType::List, std::move(default_value), std::move(help));
}
OptionSpec int_option(std::string name, int64_t default_value, IntRange range, std::string help) {
  OptionSpec s = int_option(std::move(name), default_value, std::move(help));
  s.choices = range_items(std::to_string(range.min), false, std::to_string(range.max), false);
  return s;
}
OptionSpec float_option(std::string name, double default_value, FloatRange range, std::string help) {
  OptionSpec s = float_option(std::move(name), default_value, std::move(help));
  auto end = [](double v) { return std::isfinite(v) ? format_double(v) : v > 0 ? "inf" : "-inf"; };
  s.choices = range_items(end(range.min), range.min_open || !std::isfinite(range.min), end(range.max),
                          range.max_open || !std::isfinite(range.max));
  return s;
}

std::optional<IntRange> int_range(const OptionSpec& spec) {
  if (spec.type != OptionType::Int || spec.choices.empty()) return std::nullopt;
  if (spec.choices.size() != 2) malformed_range(spec);
  const auto [lo, lo_open] = range_end(spec, spec.choices[0], true);
  const auto [hi, hi_open] = range_end(spec, spec.choices[1], false);
  IntRange r;
  if (lo_open || hi_open || !number_ok(lo, r.min) || !number_ok(hi, r.max) || r.min > r.max) malformed_range(spec);
  return r;
}

std::optional<FloatRange> float_range(const OptionSpec& spec) {
  if (spec.type != OptionType::Float || spec.choices.empty()) return std::nullopt;
  if (spec.choices.size() != 2) malformed_range(spec);
  const auto [lo, lo_open] = range_end(spec, spec.choices[0], true);
  const auto [hi, hi_open] = range_end(spec, spec.choices[1], false);
  FloatRange r{0, 0, lo_open, hi_open};
  if (!number_ok(lo, r.min) || !number_ok(hi, r.max) || std::isnan(r.min) || std::isnan(r.max) || r.min > r.max)
    malformed_range(spec);
  return r;
}

std::string expected_value(const OptionSpec& spec) {
  if (spec.type == OptionType::Choice) return "one of " + join_names(spec.choices);
  if (auto r = int_range(spec)) return int_expectation(*r);
  if (auto r = float_range(spec)) return float_expectation(*r);
  return expectation(spec.type);
}

Options::Options(const std::string& owner, const std::string& section,
                 const std::vector<OptionSpec>& specs,
                 const std::map<std::string, std::string>& given)
    : owner_(owner) {
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  for (const auto& [name, value] : given) {
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      std::string dym = did_you_mean(name, names);
      throw Error(owner + " has no option '" + name + "' (given as " + section + "." + name + ")" +
                  (dym.empty() ? "." : dym) + " Its options: " + join_names(names) + ".");
    }
  }
  for (const auto& s : specs) {
    auto it = given.find(s.name);
    bool was_given = it != given.end();
    const std::string where = owner + ": option " + section + "." + s.name +
                              (was_given ? "" : " (declared default)");
    auto [value, text] = parse_value(where, s, was_given ? it->second : s.default_value);
    values_[s.name] = {s.type, std::move(value)};
    text_[s.name] = std::move(text);
    given_[s.name] = was_given;
  }
}

const Options::Value& Options::find(const std::string& name, OptionType wanted) const {
  auto it = values_.find(name);
  if (it == values_.end())
    throw Error(owner_ + " read option '" + name + "', which it never declared (a bug in the plugin)");
  OptionType have = it->second.first;
  bool ok = have == wanted || (wanted == OptionType::String && have == OptionType::Choice);
  if (!ok)
    throw Error(owner_ + " read option '" + name + "' as " + type_name(wanted) +
                " but declared it as " + type_name(have) + " (a bug in the plugin)");
  given_[kReadMark + name] = true;
  return it->second.second;
}

bool Options::get_bool(const std::string& name) const {
  return std::get<bool>(find(name, OptionType::Bool));
}
int64_t Options::get_int(const std::string& name) const {
  return std::get<int64_t>(find(name, OptionType::Int));
}
double Options::get_float(const std::string& name) const {
  return std::get<double>(find(name, OptionType::Float));
}
const std::string& Options::get_string(const std::string& name) const {
  return std::get<std::string>(find(name, OptionType::String));
}
const std::vector<std::string>& Options::get_list(const std::string& name) const {
  return std::get<std::vector<std::string>>(find(name, OptionType::List));
}
bool Options::was_given(const std::string& name) const {
  auto it = given_.find(name);
  return it != given_.end() && it->second;
}
bool Options::was_read(const std::string& name) const { return given_.count(kReadMark + name) > 0; }

std::pair<double, double> adam_betas(const Options& o) {
  const auto& items = o.get_list("betas");
  if (items.size() != 2)
    throw Error("betas takes two numbers, e.g. 0.9,0.999; got " + std::to_string(items.size()));
  double b[2];
  for (int i = 0; i < 2; ++i) {
    char* end = nullptr;
    b[i] = std::strtod(items[i].c_str(), &end);
    if (*end || !(b[i] >= 0.0 && b[i] < 1.0))
      throw Error("betas must be two numbers in [0, 1), got '" + items[i] + "'");
  }
  return {b[0], b[1]};
}

}  // namespace fsdpx
