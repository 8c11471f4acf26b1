// fp16_mixed: fp32 master shards, all-gather and compute in fp16, gradients reduced in
// reduce_dtype (fp32 by default) and kept in fp32 for the optimizer; with a dynamic loss scaler
// that works on shards (FSDP's ShardedGradScaler; fsdpx/loss_scaling.h): the loss is multiplied by
// the scale, the gradient shards divided by it, and a step with inf/NaN on any rank is skipped
// on every rank and halves the scale; growth_interval steps in a row without one double it.
#include <cmath>

#include <nlohmann/json.hpp>

#include <fsdpx/error.h>
#include <fsdpx/loss_scaling.h>
#include <fsdpx/plugin.h>
#include <fsdpx/precision_policy.h>

namespace {

struct ScalerConfig {
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class DynamicScaler final : public fsdpx::LossScaler {
 public:
  explicit DynamicScaler(ScalerConfig c) : c_(c), scale_(c.init_scale) {}
  double scale() const override { return scale_; }

  void update(bool found_inf) override {
    if (found_inf) {
      scale_ *= c_.backoff_factor;
      good_steps_ = 0;
      return;
    }
    if (++good_steps_ >= c_.growth_interval) {
      // An fp32 scale that overflowed would make every later step skip: stay finite.
      if (std::isfinite(scale_ * c_.growth_factor) && scale_ * c_.growth_factor <= 3.0e38) scale_ *= c_.growth_factor;
      good_steps_ = 0;
    }
  }

  std::string state() const override {
    return nlohmann::json{{"scale", scale_}, {"good_steps", good_steps_}}.dump();
  }

  void load_state(const std::string& text) override {
    const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("scale") || !j["scale"].is_number() || !j.contains("good_steps") ||
        !j["good_steps"].is_number_integer())
      throw fsdpx::Error("the checkpoint's loss scaler state " + text +
                         " is not {\"scale\": number, \"good_steps\": integer}");
    const double s = j["scale"].get<double>();
    if (!(s > 0) || !std::isfinite(s))
      throw fsdpx::Error("the checkpoint's loss scale " + std::to_string(s) + " is not positive");
    scale_ = s;
    good_steps_ = j["good_steps"].get<int64_t>();
  }

 private:
  ScalerConfig c_;
  double scale_;
  int64_t good_steps_ = 0;
};

class Fp16Mixed final : public fsdpx::PrecisionPolicy, public fsdpx::LossScalingPolicy {
 public:
  Fp16Mixed(fsdpx::PrecisionSpec s, ScalerConfig c) : spec_(s), scaler_(c) {}
  fsdpx::PrecisionSpec spec(const std::string&) const override { return spec_; }
  std::unique_ptr<fsdpx::LossScaler> make_scaler() const override { return std::make_unique<DynamicScaler>(scaler_); }

 private:
  fsdpx::PrecisionSpec spec_;
  ScalerConfig scaler_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::PrecisionPolicy>(
      "fp16_mixed",
      "fp32 master shards; all-gather and compute in fp16; reduce in reduce_dtype; dynamic loss scaling on shards",
      {fsdpx::choice_option("reduce_dtype", "fp32", {"fp32", "fp16"}, "dtype of the gradient reduce-scatter"),
       fsdpx::float_option("init_scale", 65536.0, fsdpx::FloatRange::above(0), "the first loss scale"),
       fsdpx::float_option("growth_factor", 2.0, fsdpx::FloatRange::at_least(1),
                           "the scale's factor after growth_interval steps without inf/NaN"),
       fsdpx::float_option("backoff_factor", 0.5, fsdpx::FloatRange{0, 1, true, true},
                           "the scale's factor after a step with inf/NaN (skipped)"),
       fsdpx::int_option("growth_interval", 2000, fsdpx::IntRange{1}, "steps without inf/NaN before the scale grows")},
      [](const fsdpx::ComponentContext& ctx) {
        const auto& o = ctx.options;
        fsdpx::PrecisionSpec s;
        s.storage = c10::kFloat;
        s.gradient = c10::kFloat;
        s.compute = c10::kHalf;
        s.reduce = o.get_string("reduce_dtype") == "fp16" ? c10::kHalf : c10::kFloat;
        s.buffer = c10::kFloat;
        s.output = c10::kFloat;
        s.cast_forward_inputs = true;
        s.loss_scaling = true;
        ScalerConfig c;
        c.init_scale = o.get_float("init_scale");
        c.growth_factor = o.get_float("growth_factor");
        c.backoff_factor = o.get_float("backoff_factor");
        c.growth_interval = o.get_int("growth_interval");  // each within its declared range
        return std::make_shared<Fp16Mixed>(s, c);
      });
}

}  // namespace

FSDPX_PLUGIN("precision_fp16_mixed", "0.1.0", register_components)
