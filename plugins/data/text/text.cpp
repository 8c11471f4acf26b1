// text: byte-level tokens from real text files (token = byte, vocabulary 256). `path` is a file or
// a directory; in a directory every regular file (symlinks skipped) whose first 4 KiB hold no NUL
// byte is read, in name order, so Debian's fortunes corpus (/usr/share/games/fortunes, with its
// binary .dat indexes) reads as its text files alone. Sample i is bytes [i*seq, i*seq + seq]; the
// last `holdout` fraction of the samples is set aside for evaluation, the same at every world size.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/stack.h>

#include <fsdpx/data_source.h>
#include <fsdpx/error.h>
#include <fsdpx/evaluation.h>
#include <fsdpx/files.h>
#include <fsdpx/plugin.h>
#include <fsdpx/sampler.h>

namespace fs = std::filesystem;

namespace {

bool looks_like_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char buf[4096];
  in.read(buf, sizeof buf);
  return std::find(buf, buf + in.gcount(), '\0') == buf + in.gcount();
}

std::vector<fs::path> text_files(const std::string& path) {
  std::error_code ec;
  const std::string kind = fsdpx::file_kind(path);
  if (kind == "missing")
    throw fsdpx::Error("text data " + path + " does not exist (data.path); give a text file or a directory of them"
                       " (Debian's corpus: apt-get install fortunes, then /usr/share/games/fortunes)");
  if (kind != "a directory") {
    fsdpx::check_input_file(path, "data.path");  // a device such as /dev/zero would be read until memory runs out
    return {path};
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file() && !e.is_symlink() && looks_like_text(e.path())) files.push_back(e.path());
  if (ec) throw fsdpx::Error("text data directory " + path + " cannot be listed: " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw fsdpx::Error("text data directory " + path + " holds no text files (data.path)");
  return files;
}

class Text final : public fsdpx::DataSource, public fsdpx::HeldOutData {
 public:
  Text(const std::string& path, int64_t seq, double holdout) : seq_(seq) {
    const std::vector<fs::path> files = text_files(path);
    uint64_t total = 0;
    for (const auto& f : files) {
      std::error_code ec;
      const uint64_t n = fs::file_size(f, ec);
      total += ec ? 0 : n;
    }
    fsdpx::check_fits_in_memory(total, "text data " + path + " (data.path)",
                                "the text source holds its bytes in memory: tokenize it (scripts/tokenize) and "
                                "train with --data.name tokens, which reads on demand");
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      if (!in) throw fsdpx::Error("text file " + f.string() + " cannot be read (data.path)");
      bytes_.insert(bytes_.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (!bytes_.empty() && bytes_.back() != '\n') bytes_.push_back('\n');
    }
    const int64_t samples = bytes_.size() > 0 ? (static_cast<int64_t>(bytes_.size()) - 1) / seq_ : 0;
    heldout_ = static_cast<int64_t>(std::floor(samples * holdout));
    train_ = samples - heldout_;
    if (train_ < 1)
      throw fsdpx::Error("text data " + path + " holds " + std::to_string(bytes_.size()) +
                         " bytes, not one training sample of " + std::to_string(seq_ + 1) +
                         " bytes (data.seq, data.holdout)");
  }

  void open(const fsdpx::DataContext& ctx) override {
    sampler_ = std::make_unique<fsdpx::GlobalBatchSampler>(train_, ctx.batch_size * ctx.world_size, ctx.rank,
                                                           ctx.world_size, ctx.seed);
  }
  fsdpx::Batch next() override {
    if (!sampler_) throw fsdpx::Error("text: next() before open()");
    return rows(sampler_->next());
  }
  int64_t num_samples() const override { return train_; }
  std::string state() const override { return sampler_ ? sampler_->state() : "{}"; }
  void restore(const std::string& s) override {
    if (!sampler_) throw fsdpx::Error("text: restore() before open()");
    sampler_->restore(s);
  }

  int64_t num_heldout() const override { return heldout_; }
  fsdpx::Batch heldout(int64_t first, int64_t count) override {
    if (first < 0 || count < 0 || first + count > heldout_)
      throw fsdpx::Error("text: held-out samples " + std::to_string(first) + "+" + std::to_string(count) +
                         " outside 0.." + std::to_string(heldout_));
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < count; ++i) idx.push_back(train_ + first + i);
    return rows(idx);
  }

 private:
  fsdpx::Batch rows(const std::vector<int64_t>& idx) {
    at::Tensor out = at::empty({static_cast<int64_t>(idx.size()), seq_ + 1}, at::kLong);
    int64_t* o = out.data_ptr<int64_t>();
    for (size_t k = 0; k < idx.size(); ++k)
      for (int64_t j = 0; j <= seq_; ++j) o[k * (seq_ + 1) + j] = bytes_[idx[k] * seq_ + j];
    return fsdpx::next_token_batch(out);
  }

  int64_t seq_, train_ = 0, heldout_ = 0;
  std::vector<unsigned char> bytes_;
  std::unique_ptr<fsdpx::GlobalBatchSampler> sampler_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::DataSource>("text", "byte-level tokens (vocabulary 256) from a text file or a directory of them",
                           {fsdpx::string_option("path", "/usr/share/games/fortunes",
                                                 "a text file, or a directory whose text files are read"),
                            fsdpx::int_option("seq", 64, {1, 1 << 20}, "tokens per sequence"),
                            fsdpx::float_option("holdout", 0.02, fsdpx::FloatRange::closed(0, 0.5),
                                                "fraction of the samples set aside for evaluation")},
                           [](const fsdpx::ComponentContext& ctx) {
                             const auto& o = ctx.options;  // seq and holdout within their declared ranges
                             return std::make_shared<Text>(o.get_string("path"), o.get_int("seq"),
                                                           o.get_float("holdout"));
                           });
}

}  // namespace

FSDPX_PLUGIN("data_text", "0.1.0", register_components)
