// tokens: a binary file of token ids as nanoGPT-style tools write it (a flat array of uint16 or
// uint32, native byte order). Sample i is tokens [i*seq, i*seq + seq] (seq + 1 ids: inputs and
// next-token targets), so an epoch holds (count - 1) / seq samples.
#include <cstdio>
#include <cstring>
#include <fstream>

#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>

#include <fsdpx/data_source.h>
#include <fsdpx/error.h>
#include <fsdpx/files.h>
#include <fsdpx/plugin.h>
#include <fsdpx/sampler.h>

namespace {

class Tokens final : public fsdpx::DataSource {
 public:
  Tokens(std::string path, int width, int64_t seq) : path_(std::move(path)), width_(width), seq_(seq) {
    fsdpx::check_input_file(path_, "data.path");
    in_.open(path_, std::ios::binary);
    if (!in_) throw fsdpx::Error("token file " + path_ + " cannot be opened (data.path); does it exist?");
    in_.seekg(0, std::ios::end);
    const int64_t bytes = static_cast<int64_t>(in_.tellg());
    if (bytes % width_ != 0)
      throw fsdpx::Error("token file " + path_ + " has " + std::to_string(bytes) + " bytes, not a whole number of " +
                         std::to_string(width_) + "-byte tokens; is data.dtype right?");
    count_ = bytes / width_;
    if (count_ < seq_ + 1)
      throw fsdpx::Error("token file " + path_ + " holds " + std::to_string(count_) +
                         " tokens, fewer than one sample of " + std::to_string(seq_ + 1));
  }

  void open(const fsdpx::DataContext& ctx) override {
    sampler_ = std::make_unique<fsdpx::GlobalBatchSampler>(num_samples(), ctx.batch_size * ctx.world_size, ctx.rank,
                                                           ctx.world_size, ctx.seed);
  }

  fsdpx::Batch next() override {
    if (!sampler_) throw fsdpx::Error("tokens: next() before open()");
    std::vector<at::Tensor> rows;
    for (int64_t i : sampler_->next()) rows.push_back(read(i * seq_, seq_ + 1));
    return fsdpx::next_token_batch(at::stack(rows));
  }

  int64_t num_samples() const override { return (count_ - 1) / seq_; }
  std::string state() const override { return sampler_ ? sampler_->state() : "{}"; }
  void restore(const std::string& s) override {
    if (!sampler_) throw fsdpx::Error("tokens: restore() before open()");
    sampler_->restore(s);
  }

 private:
  at::Tensor read(int64_t first, int64_t n) {
    std::vector<char> buf(static_cast<size_t>(n * width_));
    in_.clear();
    in_.seekg(first * width_);
    in_.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (!in_) throw fsdpx::Error("token file " + path_ + ": cannot read tokens " + std::to_string(first) + ".." +
                                 std::to_string(first + n));
    at::Tensor out = at::empty({n}, at::kLong);
    int64_t* o = out.data_ptr<int64_t>();
    for (int64_t k = 0; k < n; ++k) {
      if (width_ == 2) {
        uint16_t v;
        std::memcpy(&v, buf.data() + k * 2, 2);
        o[k] = v;
      } else {
        uint32_t v;
        std::memcpy(&v, buf.data() + k * 4, 4);
        o[k] = v;
      }
    }
    return out;
  }

  std::string path_;
  int width_;
  int64_t seq_, count_ = 0;
  std::ifstream in_;
  std::unique_ptr<fsdpx::GlobalBatchSampler> sampler_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::DataSource>(
      "tokens", "a binary file of uint16/uint32 token ids (nanoGPT's format), read as seq+1-token samples",
      {fsdpx::string_option("path", "", "the token file"),
       fsdpx::choice_option("dtype", "uint16", {"uint16", "uint32"}, "width of one token id"),
       fsdpx::int_option("seq", 64, {1, 1 << 20}, "tokens per sequence")},
      [](const fsdpx::ComponentContext& ctx) {
        const auto& o = ctx.options;
        if (o.get_string("path").empty())
          throw fsdpx::Error("path is empty; give the token file with --data.path FILE");
        return std::make_shared<Tokens>(o.get_string("path"), o.get_string("dtype") == "uint16" ? 2 : 4,
                                        o.get_int("seq"));
      });
}

}  // namespace

FSDPX_PLUGIN("data_tokens", "0.1.0", register_components)
