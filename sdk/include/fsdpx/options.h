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
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "fsdpx/export.h"

namespace fsdpx {

enum class OptionType {
  Bool,    // true/false, 1/0, yes/no, on/off
  Int,     // a signed 64-bit integer
  Float,   // a finite double
  String,  // any text
  Choice,  // one of OptionSpec::choices
  List,    // comma-separated text items, e.g. "Block,Embedding"
};

// "bool", "int", "float", "string", "choice", "list".
FSDPX_API const char* type_name(OptionType type);

struct OptionSpec {
  std::string name;           // [a-z0-9_]+, unique within the component, not "name"
  OptionType type;
  std::string default_value;  // as it would be written in an INI file; must itself be valid
  std::string help;           // one line
  std::vector<std::string> choices;  // Choice only: the allowed values
};

// Shorthands for declaring options.
FSDPX_API OptionSpec flag_option(std::string name, bool default_value, std::string help);
FSDPX_API OptionSpec int_option(std::string name, int64_t default_value, std::string help);
FSDPX_API OptionSpec float_option(std::string name, double default_value, std::string help);
FSDPX_API OptionSpec string_option(std::string name, std::string default_value, std::string help);
FSDPX_API OptionSpec choice_option(std::string name, std::string default_value,
                                   std::vector<std::string> choices, std::string help);
FSDPX_API OptionSpec list_option(std::string name, std::string default_value, std::string help);

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
  // Every option in canonical text form (what an INI file would say), sorted by name.
  const std::map<std::string, std::string>& text() const { return text_; }

 private:
  const Value& find(const std::string& name, OptionType wanted) const;
  std::string owner_;
  std::map<std::string, std::pair<OptionType, Value>> values_;
  std::map<std::string, std::string> text_;
  std::map<std::string, bool> given_;
};

}  // namespace fsdpx
