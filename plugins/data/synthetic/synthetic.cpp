// synthetic: random token sequences for benchmarks and tests. Sample i is drawn from a generator
// seeded from (seed, i) alone, so any rank at any world size reads the same sample i.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/stack.h>

#include <fsdpx/data_source.h>
#include <fsdpx/error.h>
#include <fsdpx/plugin.h>
#include <fsdpx/sampler.h>
#include <fsdpx/seeds.h>

namespace {

class Synthetic final : public fsdpx::DataSource {
 public:
  Synthetic(int64_t samples, int64_t seq, int64_t vocab) : samples_(samples), seq_(seq), vocab_(vocab) {}

  void open(const fsdpx::DataContext& ctx) override {
    seed_ = ctx.seed;
    sampler_ = std::make_unique<fsdpx::GlobalBatchSampler>(samples_, ctx.batch_size * ctx.world_size, ctx.rank,
                                                           ctx.world_size, ctx.seed);
  }

  fsdpx::Batch next() override {
    if (!sampler_) throw fsdpx::Error("synthetic: next() before open()");
    std::vector<at::Tensor> rows;
    for (int64_t i : sampler_->next()) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(fsdpx::parameter_seed(seed_, "sample/" + std::to_string(i)));
      rows.push_back(at::randint(vocab_, {seq_ + 1}, gen, at::kLong));
    }
    return fsdpx::next_token_batch(at::stack(rows));
  }

  int64_t num_samples() const override { return samples_; }
  std::string state() const override { return sampler_ ? sampler_->state() : "{}"; }
  void restore(const std::string& s) override {
    if (!sampler_) throw fsdpx::Error("synthetic: restore() before open()");
    sampler_->restore(s);
  }

 private:
  int64_t samples_, seq_, vocab_;
  uint64_t seed_ = 0;
  std::unique_ptr<fsdpx::GlobalBatchSampler> sampler_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::DataSource>(
      "synthetic", "random token sequences, the same at every world size (for benchmarks and tests)",
      {fsdpx::int_option("samples", 4096, {1, 1 << 22}, "sequences in one epoch"),
       fsdpx::int_option("seq", 64, {1, 1 << 20}, "tokens per sequence"),
       fsdpx::int_option("vocab", 256, {1, 1 << 24}, "token ids are drawn from [0, vocab)")},
      [](const fsdpx::ComponentContext& ctx) {
        const auto& o = ctx.options;  // each within its declared range
        return std::make_shared<Synthetic>(o.get_int("samples"), o.get_int("seq"), o.get_int("vocab"));
      });
}

}  // namespace

FSDPX_PLUGIN("data_synthetic", "0.1.0", register_components)
