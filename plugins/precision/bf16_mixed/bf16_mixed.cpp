// bf16_mixed: FSDP2's MixedPrecisionPolicy. fp32 master shards; each shard is cast to param_dtype
// before its all-gather (half the bytes on the wire for bf16), forward and backward run in
// param_dtype, gradients are reduced in reduce_dtype and kept in fp32 for the optimizer.
#include <fsdpx/error.h>
#include <fsdpx/plugin.h>
#include <fsdpx/precision_policy.h>

namespace {

c10::ScalarType dtype_of(const std::string& n) {
  if (n == "bf16") return c10::kBFloat16;
  if (n == "fp16") return c10::kHalf;
  return c10::kFloat;
}

class Bf16Mixed final : public fsdpx::PrecisionPolicy {
 public:
  explicit Bf16Mixed(fsdpx::PrecisionSpec s) : spec_(s) {}
  fsdpx::PrecisionSpec spec(const std::string&) const override { return spec_; }

 private:
  fsdpx::PrecisionSpec spec_;
};

void register_components(fsdpx::Registrar& r) {
  const std::vector<std::string> low = {"bf16", "fp16", "fp32"};
  r.add<fsdpx::PrecisionPolicy>(
      "bf16_mixed", "fp32 master shards; all-gather and compute in param_dtype; reduce in reduce_dtype",
      {fsdpx::choice_option("param_dtype", "bf16", low, "dtype of the all-gather and of forward/backward"),
       fsdpx::choice_option("reduce_dtype", "fp32", low, "dtype of the gradient reduce-scatter"),
       fsdpx::choice_option("buffer_dtype", "fp32", low, "dtype of module buffers"),
       fsdpx::choice_option("output_dtype", "fp32", low, "dtype the model's floating output (the loss) is cast to"),
       fsdpx::flag_option("cast_forward_inputs", true, "cast each unit's floating inputs to param_dtype")},
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
          throw fsdpx::Error("fp16 needs loss scaling, which bf16_mixed does not do; use bf16, or --precision.name fp16_mixed");
        return std::make_shared<Bf16Mixed>(s);
      });
}

}  // namespace

FSDPX_PLUGIN("precision_bf16_mixed", "0.1.0", register_components)
