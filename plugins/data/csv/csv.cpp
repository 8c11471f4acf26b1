// csv: tabular data with a label column, e.g. the breast-cancer data set that ships inside
// scikit-learn (sklearn/datasets/data/breast_cancer.csv: a first line "569,30,malignant,benign",
// then 30 features and a 0/1 label per row). Rows are split once, from `split_seed` alone, into
// training and held-out samples; features are standardised with the training rows' mean and
// standard deviation. Labels are integers 0..C-1, or strings mapped to their index in sorted order.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

#include <ATen/ops/empty.h>

#include <fsdpx/data_source.h>
#include <fsdpx/error.h>
#include <fsdpx/evaluation.h>
#include <fsdpx/files.h>
#include <fsdpx/plugin.h>
#include <fsdpx/sampler.h>

namespace {

std::vector<std::string> split_line(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) {
    while (!field.empty() && (field.back() == '\r' || field.back() == ' ')) field.pop_back();
    while (!field.empty() && field.front() == ' ') field.erase(field.begin());
    out.push_back(field);
  }
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

bool parse_number(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(out);
}

// A CSV file's rows as numbers: features row-major, labels as class indices.
struct Table {
  int64_t rows = 0, features = 0;
  std::vector<float> x;
  std::vector<int64_t> y;
};

// The file's non-empty lines split at commas; `first_line` is the line number of the first.
std::vector<std::vector<std::string>> read_rows(std::istream& in, int64_t& first_line) {
  std::vector<std::vector<std::string>> rows;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line == "\r") continue;
    if (rows.empty()) first_line = line_no;
    rows.push_back(split_line(line));
  }
  return rows;
}

// Whether the first row is a header: asked for, or (auto) a first line that is not all numbers
// or whose width differs from the next (sklearn's "569,30,malignant,benign").
bool has_header(const std::vector<std::vector<std::string>>& rows, const std::string& header) {
  if (header != "auto") return header == "yes";
  double v;
  bool skip = false;
  for (const auto& f : rows[0]) skip = skip || !parse_number(f, v);
  return skip || (rows.size() > 1 && rows[0].size() != rows[1].size());
}

// Labels as class indices: non-negative integers as they are, else text mapped to its index in
// sorted order. A column of numbers that are not all such integers is a feature, not a label:
// refused (`where` names the file and column), since mapping each value to a class would train it
// as one.
std::vector<int64_t> label_ids(const std::vector<std::string>& labels, const std::string& where) {
  std::vector<int64_t> y(labels.size());
  bool numeric = true, all_numbers = true;
  for (size_t i = 0; i < labels.size(); ++i) {
    double v;
    const bool number = parse_number(labels[i], v);
    all_numbers = all_numbers && number;
    numeric = numeric && number && v == std::floor(v) && v >= 0 && v < 1e15;
    if (all_numbers && !numeric)
      throw fsdpx::Error(where + " holds '" + labels[i] + "' (row " + std::to_string(i + 1) +
                         "), a number that is not a class index: it looks like a feature, and the file may have no "
                         "label column. A label column holds class indices 0, 1, ... or class names; give its index "
                         "with --data.label_column N");
  }
  if (numeric) {
    for (size_t i = 0; i < labels.size(); ++i) {
      double v = 0;
      parse_number(labels[i], v);
      y[i] = static_cast<int64_t>(v);
    }
    return y;
  }
  std::map<std::string, int64_t> ids;
  for (const auto& l : labels) ids.emplace(l, 0);
  int64_t next = 0;
  for (auto& [name, id] : ids) id = next++;
  for (size_t i = 0; i < labels.size(); ++i) y[i] = ids[labels[i]];
  return y;
}

// Parses a CSV stream (named `path` in errors) into a table. Throws fsdpx::Error naming the row,
// line and column of anything that is not a number outside the label column, a ragged row, an
// empty file, or a label column outside the table.
Table parse_table(std::istream& in, const std::string& path, int64_t label_column, const std::string& header) {
  int64_t first_line = 0;
  std::vector<std::vector<std::string>> rows = read_rows(in, first_line);
  if (rows.empty()) throw fsdpx::Error("csv file " + path + " is empty (data.path)");
  const bool skip = has_header(rows, header);
  if (skip) rows.erase(rows.begin());
  if (rows.empty()) throw fsdpx::Error("csv file " + path + " has a header and no rows");
  const int64_t cols = static_cast<int64_t>(rows[0].size());
  if (cols < 2)
    throw fsdpx::Error("csv file " + path + " has " + std::to_string(cols) + " column; it needs features and a label");
  const int64_t label = label_column < 0 ? cols + label_column : label_column;
  if (label < 0 || label >= cols)
    throw fsdpx::Error("data.label_column " + std::to_string(label_column) + " is outside the " + std::to_string(cols) +
                       " columns of " + path + " (0.." + std::to_string(cols - 1) + ", or negative from the end: -1 is "
                       "the last); give the index of the column that holds the labels");
  Table t;
  t.rows = static_cast<int64_t>(rows.size());
  t.features = cols - 1;
  t.x.resize(static_cast<size_t>(t.rows * t.features));
  std::vector<std::string> labels(static_cast<size_t>(t.rows));
  for (int64_t i = 0; i < t.rows; ++i) {
    const auto& row = rows[static_cast<size_t>(i)];
    const std::string where = "csv file " + path + ": row " + std::to_string(i + 1) + " (line " +
                              std::to_string(first_line + i + (skip ? 1 : 0)) + ")";
    if (static_cast<int64_t>(row.size()) != cols)
      throw fsdpx::Error(where + " has " + std::to_string(row.size()) + " fields, the first row has " +
                         std::to_string(cols));
    int64_t k = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const std::string& field = row[static_cast<size_t>(c)];
      if (c == label) {
        labels[static_cast<size_t>(i)] = field;
        continue;
      }
      double v;
      if (!parse_number(field, v))
        throw fsdpx::Error(where + ", column " + std::to_string(c) + " is '" + field +
                           "', not a number; only the label column may hold text");
      t.x[static_cast<size_t>(i * t.features + k++)] = static_cast<float>(v);
    }
  }
  t.y = label_ids(labels, "csv file " + path + ": the label column " + std::to_string(label) + " (data.label_column)");
  return t;
}

class Csv final : public fsdpx::DataSource, public fsdpx::HeldOutData {
 public:
  Csv(const std::string& path, int64_t label_column, const std::string& header, double holdout, uint64_t split_seed,
      bool standardize) {
    // Parsed, a row's text takes about 16 times its bytes while the table is built.
    fsdpx::check_fits_in_memory(16 * fsdpx::check_input_file(path, "data.path"), "csv file " + path + " (data.path)",
                                "give a smaller file");
    std::ifstream in(path);
    if (!in) throw fsdpx::Error("csv file " + path + " cannot be opened (data.path); does it exist?");
    Table t = parse_table(in, path, label_column, header);
    n_ = t.rows;
    features_ = t.features;
    x_ = std::move(t.x);
    y_ = std::move(t.y);
    // The split: a permutation from split_seed alone; the last `holdout` fraction is held out.
    split_ = std::make_unique<fsdpx::SplitSamples>(n_, holdout, split_seed, "csv");
    train_ = split_->training();
    if (train_ < 1)
      throw fsdpx::Error("csv file " + path + " leaves no training rows with data.holdout " + std::to_string(holdout));
    if (standardize) standardise();
  }

  void open(const fsdpx::DataContext& ctx) override {
    split_->open(ctx.batch_size, ctx.rank, ctx.world_size, ctx.seed);
  }
  fsdpx::Batch next() override { return rows(split_->next()); }
  int64_t num_samples() const override { return train_; }
  std::string state() const override { return split_->state(); }
  void restore(const std::string& s) override { split_->restore(s); }

  int64_t num_heldout() const override { return split_->held_out(); }
  fsdpx::Batch heldout(int64_t first, int64_t count) override { return rows(split_->heldout(first, count)); }

 private:
  // Features to zero mean and unit variance, with the training rows' statistics.
  void standardise() {
    for (int64_t f = 0; f < features_; ++f) {
      double sum = 0, sq = 0;
      for (int64_t t = 0; t < train_; ++t)
        sum += x_[static_cast<size_t>(split_->training_sample(t) * features_ + f)];
      const double mean = sum / train_;
      for (int64_t t = 0; t < train_; ++t) {
        const double d = x_[static_cast<size_t>(split_->training_sample(t) * features_ + f)] - mean;
        sq += d * d;
      }
      const double sd = std::sqrt(sq / train_);
      for (int64_t i = 0; i < n_; ++i) {
        float& v = x_[static_cast<size_t>(i * features_ + f)];
        v = static_cast<float>((v - mean) / (sd > 0 ? sd : 1.0));
      }
    }
  }

  fsdpx::Batch rows(const std::vector<int64_t>& idx) {
    const int64_t b = static_cast<int64_t>(idx.size());
    fsdpx::Batch batch;
    batch.inputs = at::empty({b, features_}, at::kFloat);
    batch.targets = at::empty({b}, at::kLong);
    float* x = batch.inputs.data_ptr<float>();
    int64_t* y = batch.targets.data_ptr<int64_t>();
    for (int64_t k = 0; k < b; ++k) {
      std::copy_n(x_.begin() + idx[static_cast<size_t>(k)] * features_, features_, x + k * features_);
      y[k] = y_[static_cast<size_t>(idx[static_cast<size_t>(k)])];
    }
    batch.samples = batch.tokens = b;
    return batch;
  }

  int64_t n_ = 0, features_ = 0, train_ = 0;
  std::vector<float> x_;
  std::vector<int64_t> y_;
  std::unique_ptr<fsdpx::SplitSamples> split_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::DataSource>(
      "csv", "tabular rows of numeric features and a label column (e.g. scikit-learn's breast_cancer.csv)",
      {fsdpx::string_option("path", "", "the CSV file"),
       fsdpx::int_option("label_column", -1, {-(1 << 20), 1 << 20},
                         "the label's column index (negative counts from the end)"),
       fsdpx::choice_option(
           "header", "auto", {"auto", "yes", "no"},
           "whether the first line is a header (auto: when it is not all numbers or its width differs)"),
       fsdpx::float_option("holdout", 0.2, fsdpx::FloatRange::closed(0, 0.9),
                           "fraction of the rows held out for evaluation"),
       fsdpx::int_option("split_seed", 0, fsdpx::IntRange{0},
                         "seed of the train/held-out split (independent of the run's seed)"),
       fsdpx::flag_option("standardize", true,
                          "scale features to zero mean and unit variance (training rows' statistics)")},
      [](const fsdpx::ComponentContext& ctx) {
        const auto& o = ctx.options;
        if (o.get_string("path").empty()) throw fsdpx::Error("path is empty; give the CSV file with --data.path FILE");
        return std::make_shared<Csv>(o.get_string("path"), o.get_int("label_column"), o.get_string("header"),
                                     o.get_float("holdout"), static_cast<uint64_t>(o.get_int("split_seed")),
                                     o.get_bool("standardize"));
      });
}

}  // namespace

FSDPX_PLUGIN("data_csv", "0.1.0", register_components)
