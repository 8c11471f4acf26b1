// counting: sample i is the sequence i, i+1, ... (mod 256), the same sample on any rank at any
// world size. A data source on the SDK's sampler: fsdpx::GlobalBatchSampler decides which
// samples each rank reads at each step, and its position is all a checkpoint keeps.
#include <memory>
#include <vector>

#include <ATen/ops/arange.h>
#include <ATen/ops/stack.h>

#include <fsdpx/data_source.h>
#include <fsdpx/error.h>
#include <fsdpx/plugin.h>
#include <fsdpx/sampler.h>

namespace {

class Counting final : public fsdpx::DataSource {
 public:
  Counting(int64_t samples, int64_t seq) : samples_(samples), seq_(seq) {}

  void open(const fsdpx::DataContext& ctx) override {
    sampler_ = std::make_unique<fsdpx::GlobalBatchSampler>(samples_, ctx.batch_size * ctx.world_size, ctx.rank,
                                                           ctx.world_size, ctx.seed);
  }
  fsdpx::Batch next() override {
    if (!sampler_) throw fsdpx::Error("counting: next() before open()");
    std::vector<at::Tensor> rows;
    for (int64_t i : sampler_->next()) rows.push_back(at::arange(i, i + seq_ + 1, at::kLong).remainder(256));
    return fsdpx::next_token_batch(at::stack(rows));  // inputs and next-token targets
  }
  int64_t num_samples() const override { return samples_; }
  std::string state() const override { return sampler_ ? sampler_->state() : "{}"; }
  void restore(const std::string& state) override {
    if (!sampler_) throw fsdpx::Error("counting: restore() before open()");
    sampler_->restore(state);
  }

 private:
  int64_t samples_, seq_;
  std::unique_ptr<fsdpx::GlobalBatchSampler> sampler_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::DataSource>(
      "counting", "sample i counts up from i (a data source on the SDK's sampler)",
      {fsdpx::int_option("samples", 1024, {1, 1 << 20}, "sequences in one epoch"),
       fsdpx::int_option("seq", 64, {1, 1 << 16}, "tokens per sequence")},
      [](const fsdpx::ComponentContext& ctx) {
        return std::make_shared<Counting>(ctx.options.get_int("samples"), ctx.options.get_int("seq"));
      });
}

}  // namespace

FSDPX_PLUGIN("example_counting_data", "1.0.0", register_components)
