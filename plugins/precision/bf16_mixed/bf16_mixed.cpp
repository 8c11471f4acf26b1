// bf16_mixed: FSDP2's MixedPrecisionPolicy. fp32 master shards; each shard is cast to param_dtype
// before its all-gather (half the bytes on the wire for bf16), forward and backward run in
// param_dtype, gradients are reduced in reduce_dtype and kept in fp32 for the optimizer (or in
// reduce_dtype with keep_low_precision_grads, which the optimizers widen as they step).
//
// float8: bf16_mixed with the linear layers of its units in float8, as torchao's
// convert_to_float8_training with the default (tensorwise) recipe (fsdpx/float8.h); with
// float8_all_gather, the linear weights the model lists are gathered in float8 as well (torchao's
// enable_fsdp_float8_all_gather with precompute_float8_dynamic_scale_for_fsdp).
#include <regex>

#include <fsdpx/capabilities.h>
#include <fsdpx/error.h>
#include <fsdpx/plugin.h>
#include <fsdpx/precision_policy.h>

namespace {

c10::ScalarType dtype_of(const std::string& n) {
  if (n == "bf16") return c10::kBFloat16;
  if (n == "fp16") return c10::kHalf;
  return c10::kFloat;
}

// Units whose path fully matches one of `fp32_units` ("root" for the root unit: the final norm
// and the output projection of a decoder) compute and reduce in fp32, the way sensitive layers
// are kept in full precision; the others as configured. A pattern that matches no unit of the run
// is refused once the units are chosen (fsdpx::UnitNameCheck), as it would keep nothing in fp32.
// Unit paths matched whole by patterns the user gave (`option`: their option's name).
struct UnitPatterns {
  std::string option;
  std::vector<std::string> texts;
  std::vector<std::regex> patterns;

  UnitPatterns(std::string name, const std::vector<std::string>& given) : option(std::move(name)), texts(given) {
    for (const auto& u : texts) {
      try {
        patterns.emplace_back(u);
      } catch (const std::regex_error& e) {
        throw fsdpx::Error(option + ": '" + u + "' is not a regular expression (" + e.what() + ")");
      }
    }
  }
  bool match(const std::string& unit) const {
    for (const auto& re : patterns)
      if (std::regex_match(unit.empty() ? "root" : unit, re)) return true;
    return false;
  }
  // `what`: what a pattern that matches no unit fails to do.
  void check(const std::vector<std::string>& units, const std::string& what) const {
    std::vector<std::string> names;
    for (const auto& u : units) names.push_back(u.empty() ? "root" : u);
    for (size_t i = 0; i < patterns.size(); ++i) {
      bool any = false;
      for (const auto& n : names) any = any || std::regex_match(n, patterns[i]);
      if (any) continue;
      std::string list;
      for (size_t j = 0; j < names.size() && j < 8; ++j) list += (j ? ", " : "") + names[j];
      throw fsdpx::Error(option + ": '" + texts[i] + "' matches no unit, so it would " + what + "; the units are: " +
                         list + (names.size() > 8 ? ", ..." : "") +
                         " (give a unit's whole path, a regular expression matching one, or root)");
    }
  }
};

class Bf16Mixed final : public fsdpx::PrecisionPolicy,
                        public fsdpx::UnitNameCheck,
                        public fsdpx::Float8Units,
                        public fsdpx::Float8AllGather {
 public:
  // `float8`: every unit not kept in fp32 computes its linears in float8, or those `float8_units`
  // names where it names any; `all_gather`: they gather their linear weights in float8.
  Bf16Mixed(fsdpx::PrecisionSpec s, UnitPatterns fp32_units, bool float8, UnitPatterns float8_units, bool all_gather)
      : spec_(s),
        fp32_units_(std::move(fp32_units)),
        float8_(float8),
        float8_units_(std::move(float8_units)),
        all_gather_(all_gather) {}
  fsdpx::PrecisionSpec spec(const std::string& unit) const override {
    if (fp32_units_.match(unit)) {
      fsdpx::PrecisionSpec full = spec_;
      full.compute = c10::kFloat;
      full.reduce = c10::kFloat;
      full.cast_forward_inputs = true;  // a bf16 activation from the unit before comes in as fp32
      return full;
    }
    return spec_;
  }

  bool float8(const std::string& unit) const override {
    if (!float8_ || fp32_units_.match(unit)) return false;
    return float8_units_.patterns.empty() || float8_units_.match(unit);
  }

  bool float8_all_gather() const override { return all_gather_; }

  void check_unit_names(const std::vector<std::string>& units) const override {
    fp32_units_.check(units, "keep nothing in fp32");
    float8_units_.check(units, "compute nothing in float8");
  }

 private:
  fsdpx::PrecisionSpec spec_;
  UnitPatterns fp32_units_;
  bool float8_;
  UnitPatterns float8_units_;
  bool all_gather_;
};

std::vector<fsdpx::OptionSpec> mixed_options(bool float8) {
  const std::vector<std::string> low = {"bf16", "fp16", "fp32"};
  std::vector<fsdpx::OptionSpec> o = {
      fsdpx::choice_option("param_dtype", "bf16", low, "dtype of the all-gather and of forward/backward"),
      fsdpx::choice_option("reduce_dtype", "fp32", low, "dtype of the gradient reduce-scatter"),
      fsdpx::choice_option("buffer_dtype", "fp32", low, "dtype of module buffers"),
      fsdpx::choice_option("output_dtype", "fp32", low, "dtype the model's floating output (the loss) is cast to"),
      fsdpx::flag_option("cast_forward_inputs", true, "cast each unit's floating inputs to param_dtype"),
      fsdpx::flag_option("keep_low_precision_grads", false,
                         "keep the gradient shards in reduce_dtype instead of fp32 (half their bytes for bf16); "
                         "the optimizer widens them as it steps"),
      fsdpx::list_option("fp32_units", "",
                         std::string("units kept in fp32 compute and reduce") + (float8 ? " (and not in float8)" : "") +
                             ": their paths or regular expressions matching them whole, 'root' for the root unit "
                             "(e.g. root,layers\\.0)")};
  if (float8) {
    o.push_back(fsdpx::list_option("float8_units", "",
                                   "the units whose linear layers compute in float8, as paths or regular expressions "
                                   "(empty: every unit not in fp32_units)"));
    o.push_back(fsdpx::flag_option("float8_all_gather", false,
                                   "gather the float8 units' linear weights in float8 (half of bf16's all-gather "
                                   "bytes), cast on the shards with one scale per weight computed before each "
                                   "forward; needs a sharded layout and a model that lists its linear weights (gpt)"));
  }
  return o;
}

std::shared_ptr<fsdpx::PrecisionPolicy> make_mixed(const fsdpx::ComponentContext& ctx, bool float8) {
  const auto& o = ctx.options;
  fsdpx::PrecisionSpec s;
  s.storage = c10::kFloat;
  s.gradient = c10::kFloat;
  s.compute = dtype_of(o.get_string("param_dtype"));
  s.reduce = dtype_of(o.get_string("reduce_dtype"));
  s.buffer = dtype_of(o.get_string("buffer_dtype"));
  s.output = dtype_of(o.get_string("output_dtype"));
  s.cast_forward_inputs = o.get_bool("cast_forward_inputs");
  if (s.compute == c10::kHalf || s.reduce == c10::kHalf)
    throw fsdpx::Error(std::string("fp16 needs loss scaling, which ") + (float8 ? "float8" : "bf16_mixed") +
                       " does not do; use bf16" + (float8 ? "" : ", or --precision.name fp16_mixed"));
  UnitPatterns fp32("fp32_units", o.get_list("fp32_units"));
  if (o.get_bool("keep_low_precision_grads")) {
    if (s.reduce == c10::kFloat)
      throw fsdpx::Error("keep_low_precision_grads keeps the gradient shards in reduce_dtype, which is fp32 "
                         "here: nothing to keep lower; set reduce_dtype bf16 as well");
    if (!fp32.texts.empty())  // a run has one gradient dtype (check_unit_precision)
      throw fsdpx::Error("keep_low_precision_grads keeps every unit's gradient shard in bf16, and fp32_units "
                         "asks for fp32 gradients of some units; drop one of them");
    s.gradient = s.reduce;
  }
  UnitPatterns f8("float8_units", float8 ? o.get_list("float8_units") : std::vector<std::string>{});
  const bool all_gather = float8 && o.get_bool("float8_all_gather");
  return std::make_shared<Bf16Mixed>(s, std::move(fp32), float8, std::move(f8), all_gather);
}

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::PrecisionPolicy>(
      "bf16_mixed", "fp32 master shards; all-gather and compute in param_dtype; reduce in reduce_dtype",
      mixed_options(false), [](const fsdpx::ComponentContext& ctx) { return make_mixed(ctx, false); });
  r.add<fsdpx::PrecisionPolicy>(
      "float8",
      "bf16_mixed with each unit's linear layers in float8: e4m3 inputs and weights, e5m2 output gradients, "
      "one dynamic scale per tensor (torchao's tensorwise recipe)",
      mixed_options(true), [](const fsdpx::ComponentContext& ctx) { return make_mixed(ctx, true); });
}

}  // namespace

FSDPX_PLUGIN("precision_bf16_mixed", "0.1.0", register_components)
