// fsdpx/options.h: options a component declares, and the typed values it is created with.
//
// A component declares its options (name, type, default, help) when it registers. The host
// builds Boost.Program_options descriptions from them, so each option is accepted on the
// command line as --<section>.<name> VALUE and in an INI file as `<name>=VALUE` under
// [<section>]. Values arrive as text and are checked against the declared type before the
// component's factory runs; an ill-typed value is an error naming the component, the option and
// the expected type.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "fsdpx/export.h"

namespace fsdpx {

enum class OptionType {
  Bool,    // true/false, 1/0, yes/no, on/off
  Int,     // a signed 64-bit integer, within the option's declared range
  Float,   // a finite double, within the option's declared range
  String,  // any text
  Choice,  // one of OptionSpec::choices
  List,    // comma-separated text items, e.g. "Block,Embedding"
};

// "bool", "int", "float", "string", "choice", "list".
FSDPX_API const char* type_name(OptionType type);

struct OptionSpec {
  std::string name;           // [a-z0-9_]+, unique within the component, not "name"
  OptionType type;
  // As it would be written in an INI file; must itself be valid (checked when the plugin
  // registers): a string default may not hold '#', a newline, or leading or trailing spaces,
  // which an INI file cannot carry, and a numeric default must lie in the declared range.
  std::string default_value;
  std::string help;           // one line
  // Choice: the allowed values. Int and Float: the declared range, when there is one (two
  // items, as int_option/float_option with a range write them: "[1" and "65536]", "(0" and
  // "inf]"); empty: any value of the type. The range rides in this field so that OptionSpec
  // keeps the layout of ABI 1.0. int_range()/float_range() read it back.
  std::vector<std::string> choices;
};

// The values a numeric option allows. Every numeric option should declare one: a value outside
// it is refused before the component sees it, with the range in the message.
struct IntRange {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
};
struct FloatRange {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;  // min itself is not allowed
  bool max_open = false;  // max itself is not allowed

  static FloatRange closed(double lo, double hi) { return {lo, hi, false, false}; }
  static FloatRange at_least(double lo) { return {lo, std::numeric_limits<double>::infinity(), false, false}; }
  static FloatRange above(double lo, double hi = std::numeric_limits<double>::infinity()) {
    return {lo, hi, true, false};
  }
};

// Shorthands for declaring options.
FSDPX_API OptionSpec flag_option(std::string name, bool default_value, std::string help);
FSDPX_API OptionSpec int_option(std::string name, int64_t default_value, std::string help);
FSDPX_API OptionSpec float_option(std::string name, double default_value, std::string help);
FSDPX_API OptionSpec string_option(std::string name, std::string default_value, std::string help);
FSDPX_API OptionSpec choice_option(std::string name, std::string default_value,
                                   std::vector<std::string> choices, std::string help);
FSDPX_API OptionSpec list_option(std::string name, std::string default_value, std::string help);
// Numeric options with their range: int_option("dim", 0, {0, 65536}, "...").
FSDPX_API OptionSpec int_option(std::string name, int64_t default_value, IntRange range, std::string help);
FSDPX_API OptionSpec float_option(std::string name, double default_value, FloatRange range, std::string help);
// The range a numeric option declared, if any. Throws fsdpx::Error on a malformed one.
FSDPX_API std::optional<IntRange> int_range(const OptionSpec& spec);
FSDPX_API std::optional<FloatRange> float_range(const OptionSpec& spec);
// What a value of `spec` must be, for messages: "an integer in [1, 65536]", "a number greater
// than 0", "one of fp32, bf16", "a boolean (true/false, yes/no, on/off, 1/0)".
FSDPX_API std::string expected_value(const OptionSpec& spec);

// The checked values of one component's options: every declared option has a value (given or
// default). Built by the host; a component reads it in its factory.
class FSDPX_API Options {
 public:
  using Value = std::variant<bool, int64_t, double, std::string, std::vector<std::string>>;

  Options() = default;
  // Checks `given` (option name -> text) against `specs` and fills in defaults. `owner` names the
  // component in errors, e.g. "wrap policy 'size_based' (plugin wrap_size_based)"; `section`
  // is its option prefix. Throws fsdpx::Error on an unknown option (with the closest declared
  // name) or a value that does not parse as the declared type.
  Options(const std::string& owner, const std::string& section, const std::vector<OptionSpec>& specs,
          const std::map<std::string, std::string>& given);

  // Typed access. Throws fsdpx::Error if `name` was not declared or has another type (a bug in
  // the component, named as such).
  bool get_bool(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;  // String and Choice
  const std::vector<std::string>& get_list(const std::string& name) const;

  bool was_given(const std::string& name) const;  // given by the user, not defaulted
  // Whether the component read `name` through a get_* call on this object since it was built (ABI
  // 1.x addition). The host refuses an option the user gave that nothing read (RunConfig), and
  // records in a run's config.ini only the options that were read. was_given() is no read.
  bool was_read(const std::string& name) const;
  // Every option in canonical text form (what an INI file would say), sorted by name.
  const std::map<std::string, std::string>& text() const { return text_; }

 private:
  const Value& find(const std::string& name, OptionType wanted) const;
  std::string owner_;
  std::map<std::string, std::pair<OptionType, Value>> values_;
  std::map<std::string, std::string> text_;
  // name -> given by the user; and, kept in the same map so that the layout stays ABI 1.0's,
  // "read:" + name -> read (marked by every get_*; no option name holds the mark's ':').
  // Reading marks, so it is mutable; one component reads its options on one thread.
  mutable std::map<std::string, bool> given_;
};

}  // namespace fsdpx
