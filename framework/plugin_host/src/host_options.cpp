#include "fsdpx/framework/plugin_host/host_options.h"

#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <boost/program_options/errors.hpp>

#include "fsdpx/error.h"

namespace fsdpx {
namespace po = boost::program_options;

namespace {

// A typed value parsed through fsdpx's option rules (options.h) instead of Boost's lexical cast.
template <class T>
class CheckedValue final : public po::typed_value<T> {
 public:
  explicit CheckedValue(OptionSpec spec) : po::typed_value<T>(nullptr), spec_(std::move(spec)) {}

  void xparse(boost::any& store, const std::vector<std::string>& tokens) const override {
    po::validators::check_first_occurrence(store);
    const std::string& text = po::validators::get_single_string(tokens);
    Options parsed;
    try {
      parsed = Options("", "", {spec_}, {{spec_.name, text}});
    } catch (const Error&) {
      // Boost names the option (as the user spelled it) and fills in the value.
      po::error_with_option_name e("%canonical_option% expects " + expected_value(spec_) + ", got '%value%'");
      e.set_substitute("value", text);
      throw e;
    }
    if constexpr (std::is_same_v<T, double>) store = parsed.get_float(spec_.name);
    else store = static_cast<T>(parsed.get_int(spec_.name));
  }

 private:
  OptionSpec spec_;
};

}  // namespace

template <class T>
po::typed_value<T>* int_value(IntRange range) {
  range.min = std::max<int64_t>(range.min, std::numeric_limits<T>::min());
  range.max = std::min<int64_t>(range.max, std::numeric_limits<T>::max());
  return new CheckedValue<T>(int_option("value", range.min, range, ""));
}

template po::typed_value<int>* int_value<int>(IntRange range);
template po::typed_value<int64_t>* int_value<int64_t>(IntRange range);

po::typed_value<double>* float_value(FloatRange range) {
  return new CheckedValue<double>(float_option("value", 0, range, ""));  // the default is never parsed
}

}  // namespace fsdpx
