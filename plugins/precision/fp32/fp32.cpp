// fp32: everything in fp32 (storage, compute, communication, gradients).
#include <fsdpx/plugin.h>
#include <fsdpx/precision_policy.h>

namespace {
class Fp32 final : public fsdpx::PrecisionPolicy {
 public:
  fsdpx::PrecisionSpec spec(const std::string&) const override { return fsdpx::PrecisionSpec{}; }
};
void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::PrecisionPolicy>("fp32", "fp32 storage, compute, communication and gradients", {},
                                [](const fsdpx::ComponentContext&) { return std::make_shared<Fp32>(); });
}
}  // namespace

FSDPX_PLUGIN("precision_fp32", "0.1.0", register_components)
