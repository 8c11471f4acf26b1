// bf16_mixed: FSDP2's MixedPrecisionPolicy. fp32 master shards; each shard is cast to param_dtype
// before its all-gather (half the bytes on the wire for bf16), forward and backward run in
// param_dtype, gradients are reduced in reduce_dtype and kept in fp32 for the optimizer (or in
// reduce_dtype with keep_low_precision_grads, which the optimizers widen as they step).
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
class Bf16Mixed final : public fsdpx::PrecisionPolicy, public fsdpx::UnitNameCheck {
 public:
  Bf16Mixed(fsdpx::PrecisionSpec s, std::vector<std::string> texts, std::vector<std::regex> fp32_units)
      : spec_(s), texts_(std::move(texts)), fp32_units_(std::move(fp32_units)) {}
  fsdpx::PrecisionSpec spec(const std::string& unit) const override {
    const std::string name = unit.empty() ? "root" : unit;
    for (const auto& re : fp32_units_)
      if (std::regex_match(name, re)) {
        fsdpx::PrecisionSpec full = spec_;
        full.compute = c10::kFloat;
        full.reduce = c10::kFloat;
        full.cast_forward_inputs = true;  // a bf16 activation from the unit before comes in as fp32
        return full;
      }
    return spec_;
  }

  void check_unit_names(const std::vector<std::string>& units) const override {
    std::vector<std::string> names;
    for (const auto& u : units) names.push_back(u.empty() ? "root" : u);
    for (size_t i = 0; i < fp32_units_.size(); ++i) {
      bool any = false;
      for (const auto& n : names) any = any || std::regex_match(n, fp32_units_[i]);
      if (any) continue;
      std::string list;
      for (size_t j = 0; j < names.size() && j < 8; ++j) list += (j ? ", " : "") + names[j];
      throw fsdpx::Error("fp32_units: '" + texts_[i] + "' matches no unit, so it would keep nothing in fp32; the "
                         "units are: " + list + (names.size() > 8 ? ", ..." : "") +
                         " (give a unit's whole path, a regular expression matching one, or root)");
    }
  }

 private:
  fsdpx::PrecisionSpec spec_;
  std::vector<std::string> texts_;
  std::vector<std::regex> fp32_units_;
};

void register_components(fsdpx::Registrar& r) {
  const std::vector<std::string> low = {"bf16", "fp16", "fp32"};
  r.add<fsdpx::PrecisionPolicy>(
      "bf16_mixed", "fp32 master shards; all-gather and compute in param_dtype; reduce in reduce_dtype",
      {fsdpx::choice_option("param_dtype", "bf16", low, "dtype of the all-gather and of forward/backward"),
       fsdpx::choice_option("reduce_dtype", "fp32", low, "dtype of the gradient reduce-scatter"),
       fsdpx::choice_option("buffer_dtype", "fp32", low, "dtype of module buffers"),
       fsdpx::choice_option("output_dtype", "fp32", low, "dtype the model's floating output (the loss) is cast to"),
       fsdpx::flag_option("cast_forward_inputs", true, "cast each unit's floating inputs to param_dtype"),
       fsdpx::flag_option("keep_low_precision_grads", false,
                          "keep the gradient shards in reduce_dtype instead of fp32 (half their bytes for bf16); "
                          "the optimizer widens them as it steps"),
       fsdpx::list_option("fp32_units", "",
                          "units kept in fp32 compute and reduce: their paths or regular expressions matching them "
                          "whole, 'root' for the root unit (e.g. root,layers\\.0)")},
      [](const fsdpx::ComponentContext& ctx) {
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
          throw fsdpx::Error(
              "fp16 needs loss scaling, which bf16_mixed does not do; use bf16, or --precision.name fp16_mixed");
        if (o.get_bool("keep_low_precision_grads")) {
          if (s.reduce == c10::kFloat)
            throw fsdpx::Error("keep_low_precision_grads keeps the gradient shards in reduce_dtype, which is fp32 "
                               "here: nothing to keep lower; set reduce_dtype bf16 as well");
          if (!o.get_list("fp32_units").empty())  // a run has one gradient dtype (check_unit_precision)
            throw fsdpx::Error("keep_low_precision_grads keeps every unit's gradient shard in bf16, and fp32_units "
                               "asks for fp32 gradients of some units; drop one of them");
          s.gradient = s.reduce;
        }
        std::vector<std::regex> fp32;
        const std::vector<std::string>& texts = o.get_list("fp32_units");
        for (const auto& u : texts) {
          try {
            fp32.emplace_back(u);
          } catch (const std::regex_error& e) {
            throw fsdpx::Error("fp32_units: '" + u + "' is not a regular expression (" + e.what() + ")");
          }
        }
        return std::make_shared<Bf16Mixed>(s, texts, std::move(fp32));
      });
}

}  // namespace

FSDPX_PLUGIN("precision_bf16_mixed", "0.1.0", register_components)
