// pure_bf16: parameters, gradients and communication all in bf16, with no fp32 master copy:
// half the memory of bf16_mixed's master shards. Meant for anyprecision_adamw with Kahan
// summation, which keeps the small updates bf16 rounding would otherwise swallow.
#include <fsdpx/plugin.h>
#include <fsdpx/precision_policy.h>

namespace {
class PureBf16 final : public fsdpx::PrecisionPolicy {
 public:
  fsdpx::PrecisionSpec spec(const std::string&) const override {
    fsdpx::PrecisionSpec s;
    s.storage = s.compute = s.reduce = s.gradient = c10::kBFloat16;
    s.buffer = c10::kBFloat16;
    return s;
  }
};
void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::PrecisionPolicy>("pure_bf16", "bf16 parameters, gradients and communication; no fp32 master copy", {},
                                [](const fsdpx::ComponentContext&) { return std::make_shared<PureBf16>(); });
}
}  // namespace

FSDPX_PLUGIN("precision_pure_bf16", "0.1.0", register_components)
