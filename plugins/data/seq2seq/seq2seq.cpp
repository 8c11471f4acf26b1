// seq2seq: source/target pairs for an encoder-decoder (the t5 model), from JSON lines, a JSON
// array or CSV with a header. Text is tokenised by ByT5's byte scheme (UTF-8 byte b is id b + 3,
// eos 1 after each field, pad 0; nothing to download); a field that is a list of ids is taken as
// it is (scripts/tokenize --pairs writes such a file with a tokenizer of one's own).
//
// A batch is inputs = source ids [B, source_len] padded with 0, targets = labels [B, target_len]
// padded with -100 (no target token), the shapes fixed so that every step holds the same memory.
// A field longer than its length is refused, naming its row and line, unless --data.truncate.
// Rows are split once, from split_seed alone, into training and held-out pairs; training batches
// come from GlobalBatchSampler (the same global batch at any world size, resumable).
#include <ATen/ops/full.h>
#include <fsdpx/data_source.h>
#include <fsdpx/error.h>
#include <fsdpx/evaluation.h>
#include <fsdpx/files.h>
#include <fsdpx/sampler.h>
#include <fsdpx/plugin.h>

#include <cmath>
#include <fstream>
#include <numeric>
#include <random>

#include "pairs.h"

namespace {

constexpr int64_t kIgnore = -100;

class Seq2Seq final : public fsdpx::DataSource, public fsdpx::HeldOutData {
 public:
  Seq2Seq(const std::string& path, const seq2seq::PairOptions& o, double holdout, uint64_t split_seed)
      : source_len_(o.source_len), target_len_(o.target_len) {
    // Parsed, a pair takes its ids (4 bytes each) and, for JSON, a document tree while read.
    fsdpx::check_fits_in_memory(16 * fsdpx::check_input_file(path, "data.path"),
                                "seq2seq file " + path + " (data.path)", "give a smaller file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw fsdpx::Error("seq2seq file " + path + " cannot be opened (data.path)");
    pairs_ = seq2seq::read_pairs(in, path, o);
    const int64_t n = pairs_.size();
    split_ = std::make_unique<fsdpx::SplitSamples>(n, holdout, split_seed, "seq2seq");
    if (split_->training() < 1)
      throw fsdpx::Error("seq2seq file " + path + " holds " + std::to_string(n) +
                         " pair(s), none left for training with data.holdout " + std::to_string(holdout));
  }

  void open(const fsdpx::DataContext& ctx) override {
    split_->open(ctx.batch_size, ctx.rank, ctx.world_size, ctx.seed);
  }
  fsdpx::Batch next() override { return rows(split_->next()); }
  int64_t num_samples() const override { return split_->training(); }
  std::string state() const override { return split_->state(); }
  void restore(const std::string& s) override { split_->restore(s); }

  int64_t num_heldout() const override { return split_->held_out(); }
  fsdpx::Batch heldout(int64_t first, int64_t count) override { return rows(split_->heldout(first, count)); }

 private:
  fsdpx::Batch rows(const std::vector<int64_t>& idx) const {
    const int64_t b = static_cast<int64_t>(idx.size());
    fsdpx::Batch batch;
    batch.inputs = at::full({b, source_len_}, seq2seq::kPad, at::kLong);
    batch.targets = at::full({b, target_len_}, kIgnore, at::kLong);
    int64_t* s = batch.inputs.data_ptr<int64_t>();
    int64_t* t = batch.targets.data_ptr<int64_t>();
    for (int64_t k = 0; k < b; ++k) {
      const auto i = static_cast<size_t>(idx[static_cast<size_t>(k)]);
      std::copy_n(pairs_.ids.begin() + pairs_.source_at[i], pairs_.source_n[i], s + k * source_len_);
      std::copy_n(pairs_.ids.begin() + pairs_.target_at[i], pairs_.target_n[i], t + k * target_len_);
    }
    batch.samples = b;
    batch.tokens = b * (source_len_ + target_len_);  // what the model computes on, padding included
    return batch;
  }

  int64_t source_len_, target_len_;
  seq2seq::Pairs pairs_;
  std::unique_ptr<fsdpx::SplitSamples> split_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::DataSource>(
      "seq2seq",
      "source/target pairs (JSON lines, JSON, CSV) for an encoder-decoder: ByT5 bytes, or ids from scripts/tokenize",
      {fsdpx::string_option("path", "",
                            "the pairs: .jsonl (one object per line), .json (an array), or .csv (a header)"),
       fsdpx::choice_option("format", "auto", {"auto", "jsonl", "json", "csv"},
                            "the file's format (auto: by extension)"),
       fsdpx::string_option("source_field", "source", "the field (CSV: column) of the source: text, or a list of ids"),
       fsdpx::string_option("target_field", "target", "the field (CSV: column) of the target: text, or a list of ids"),
       fsdpx::int_option("source_len", 128, {1, 1 << 20}, "source ids per sample, eos included (padded with 0)"),
       fsdpx::int_option("target_len", 128, {1, 1 << 20}, "target ids per sample, eos included (padded with -100)"),
       fsdpx::flag_option("truncate", false, "cut a field longer than its length (keeping eos) instead of refusing it"),
       fsdpx::float_option("holdout", 0.05, fsdpx::FloatRange::closed(0, 0.9), "fraction of the pairs held out"),
       fsdpx::int_option("split_seed", 0, fsdpx::IntRange{0},
                         "seed of the train/held-out split (independent of the run's seed)")},
      [](const fsdpx::ComponentContext& ctx) {
        const auto& o = ctx.options;
        if (o.get_string("path").empty())
          throw fsdpx::Error("path is empty; give the pairs file with --data.path FILE");
        seq2seq::PairOptions p;
        p.format = o.get_string("format");
        p.source_field = o.get_string("source_field");
        p.target_field = o.get_string("target_field");
        p.source_len = o.get_int("source_len");
        p.target_len = o.get_int("target_len");
        p.truncate = o.get_bool("truncate");
        return std::make_shared<Seq2Seq>(o.get_string("path"), p, o.get_float("holdout"),
                                         static_cast<uint64_t>(o.get_int("split_seed")));
      });
}

}  // namespace

FSDPX_PLUGIN("data_seq2seq", "0.1.0", register_components)
