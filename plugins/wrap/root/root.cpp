// root: the whole model as one unit, FSDP's behaviour without an auto-wrap policy (fully_shard on
// the root module alone). Every parameter is gathered with one all-gather before the forward and
// its gradients reduced with one reduce-scatter after the backward, so the gathered model is the
// step's peak: the untuned baseline of the FSDP blog's table, which transformer wrapping beats.
#include <fsdpx/plugin.h>
#include <fsdpx/wrap_policy.h>

namespace {

class RootWrap final : public fsdpx::WrapPolicy {
 public:
  // No submodule: the root, always a unit, takes every parameter.
  std::vector<fsdpx::UnitSelection> select(const torch::nn::Module& /*root*/) const override { return {}; }
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::WrapPolicy>("root",
                           "the whole model as one unit (FSDP's default without an auto-wrap policy: fully_shard on "
                           "the root alone)",
                           {}, [](const fsdpx::ComponentContext&) { return std::make_shared<RootWrap>(); });
}

}  // namespace

FSDPX_PLUGIN("wrap_root", "0.1.0", register_components)
