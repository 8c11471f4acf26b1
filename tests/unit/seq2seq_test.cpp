// The seq2seq data source through the plugin host: ByT5's byte ids, fixed padded shapes, the same
// global batch at any world size, resumption, held-out pairs apart from training, JSON lines, a
// JSON array, CSV with quoted fields, lists of ids; and every bad row named by row, line, field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "fsdpx/data_source.h"
#include "fsdpx/evaluation.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "test_paths.h"

namespace fsdpx {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class Seq2SeqTest : public ::testing::Test {
 protected:
  void SetUp() override { host.load_file(test::plugin_dir() / "data_seq2seq.so"); }
  std::shared_ptr<DataSource> make(const std::string& file, const std::string& text,
                                   std::map<std::string, std::string> options = {}) {
    test::write_file(dir.path() / file, text);
    options["path"] = (dir.path() / file).string();
    return host.create<DataSource>("seq2seq", options);
  }
  std::string error(const std::string& file, const std::string& text, std::map<std::string, std::string> options = {}) {
    return test::error_of([&] { make(file, text, std::move(options)); });
  }
  PluginHost host;
  test::TempDir dir;
};

std::vector<int64_t> row(const at::Tensor& t, int64_t i) {
  at::Tensor r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

// n pairs "source i" -> "t i", in JSON lines.
std::string numbered(int n) {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += json{{"source", "source " + std::to_string(i)}, {"target", "t" + std::to_string(i)}}.dump() + "\n";
  return s;
}

TEST_F(Seq2SeqTest, BytesPlusThreeThenEosPaddedToFixedShapes) {
  auto d = make("p.jsonl", "{\"source\": \"ab\", \"target\": \"\\u00e9\"}\n",
                {{"source_len", "5"}, {"target_len", "4"}, {"holdout", "0"}});
  d->open(DataContext{0, 1, 1, 0});
  const Batch b = d->next();
  EXPECT_EQ(row(b.inputs, 0), (std::vector<int64_t>{'a' + 3, 'b' + 3, 1, 0, 0}));
  EXPECT_EQ(row(b.targets, 0), (std::vector<int64_t>{0xC3 + 3, 0xA9 + 3, 1, -100}));  // é is two UTF-8 bytes
  EXPECT_EQ(b.samples, 1);
  EXPECT_EQ(b.tokens, 9);
}

TEST_F(Seq2SeqTest, TheSameGlobalBatchAtEveryWorldSizeAndResumable) {
  const std::string text = numbered(48);
  auto global = [&](int world, int step) {
    std::set<std::vector<int64_t>> rows;
    for (int r = 0; r < world; ++r) {
      auto d = make("p.jsonl", text, {{"source_len", "12"}, {"target_len", "6"}});
      d->open(DataContext{r, world, 6 / world, 7});
      Batch b;
      for (int s = 0; s <= step; ++s) b = d->next();
      for (int64_t i = 0; i < b.inputs.size(0); ++i) EXPECT_TRUE(rows.insert(row(b.inputs, i)).second);  // disjoint
    }
    return rows;
  };
  for (int step : {0, 3}) {
    const auto one = global(1, step);
    EXPECT_EQ(one.size(), 6u);
    EXPECT_EQ(global(2, step), one);
    EXPECT_EQ(global(3, step), one);
  }
  auto a = make("p.jsonl", text, {{"source_len", "12"}, {"target_len", "6"}});
  a->open(DataContext{1, 2, 3, 7});
  a->next();
  auto resumed = make("p.jsonl", text, {{"source_len", "12"}, {"target_len", "6"}});
  resumed->open(DataContext{1, 2, 3, 7});
  resumed->restore(a->state());
  EXPECT_TRUE(resumed->next().inputs.equal(a->next().inputs));
}

TEST_F(Seq2SeqTest, HeldOutPairsAreApartFromTraining) {
  auto d = make("p.jsonl", numbered(40), {{"source_len", "12"}, {"target_len", "6"}, {"holdout", "0.25"}});
  auto* h = dynamic_cast<HeldOutData*>(d.get());
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(d->num_samples(), 30);
  EXPECT_EQ(h->num_heldout(), 10);
  std::set<std::vector<int64_t>> held, trained;
  const Batch hb = h->heldout(0, 10);
  for (int64_t i = 0; i < 10; ++i) held.insert(row(hb.inputs, i));
  d->open(DataContext{0, 1, 30, 1});
  const Batch tb = d->next();
  for (int64_t i = 0; i < 30; ++i) trained.insert(row(tb.inputs, i));
  EXPECT_EQ(held.size(), 10u);
  EXPECT_EQ(trained.size(), 30u);
  for (const auto& r : held) EXPECT_EQ(trained.count(r), 0u);
}

TEST_F(Seq2SeqTest, CsvJsonArraysAndListsOfIds) {
  // Quoted fields with commas, doubled quotes and a line break; columns in any order.
  auto csv = make("p.csv", "id,target,source\n1,\"x, \"\"y\"\"\",\"a\nb\"\n2,z,c\n",
                  {{"source_len", "4"}, {"target_len", "8"}, {"holdout", "0"}});
  csv->open(DataContext{0, 1, 2, 0});
  std::set<std::vector<int64_t>> sources;
  const Batch b = csv->next();
  for (int64_t i = 0; i < 2; ++i) sources.insert(row(b.inputs, i));
  EXPECT_EQ(sources, (std::set<std::vector<int64_t>>{{'a' + 3, '\n' + 3, 'b' + 3, 1}, {'c' + 3, 1, 0, 0}}));
  auto arr =
      make("p.json", " [{\"q\": [5, 6, 1], \"a\": [7, 1]}]",
           {{"source_field", "q"}, {"target_field", "a"}, {"source_len", "4"}, {"target_len", "2"}, {"holdout", "0"}});
  arr->open(DataContext{0, 1, 1, 0});
  const Batch c = arr->next();
  EXPECT_EQ(row(c.inputs, 0), (std::vector<int64_t>{5, 6, 1, 0}));
  EXPECT_EQ(row(c.targets, 0), (std::vector<int64_t>{7, 1}));
  // Truncation, when asked: the cut keeps eos.
  auto cut = make("t.jsonl", "{\"source\": [5, 6, 7, 8, 1], \"target\": \"abcdef\"}\n",
                  {{"source_len", "3"}, {"target_len", "3"}, {"truncate", "true"}, {"holdout", "0"}});
  cut->open(DataContext{0, 1, 1, 0});
  const Batch t = cut->next();
  EXPECT_EQ(row(t.inputs, 0), (std::vector<int64_t>{5, 6, 1}));
  EXPECT_EQ(row(t.targets, 0), (std::vector<int64_t>{'a' + 3, 'b' + 3, 1}));
}

TEST_F(Seq2SeqTest, BadRowsNameTheRowLineAndField) {
  const std::string prefix = "data source 'seq2seq' (plugin data_seq2seq): seq2seq file ";
  const std::string jl = (dir.path() / "p.jsonl").string(), csv = (dir.path() / "p.csv").string();
  const std::string two = "{\"source\": \"a\", \"target\": \"b\"}\n\n";
  EXPECT_EQ(error("p.jsonl", two + "{\"source\": \"a\", \"tgt\": \"b\"}\n"),
            prefix + jl +
                ": row 2 (line 3): no field 'target' (the row has: source, tgt); name the field with "
                "--data.source_field / --data.target_field");
  EXPECT_EQ(error("p.jsonl", two + "{\"source\": \"a\", \"target\": 5}\n"),
            prefix + jl + ": row 2 (line 3): field 'target' is a number, not text or a list of token ids");
  EXPECT_EQ(error("p.jsonl", two + "{\"source\": \"abcdef\", \"target\": \"b\"}\n", {{"source_len", "4"}}),
            prefix + jl +
                ": row 2 (line 3): field 'source' has 7 tokens (6 bytes and eos), more than "
                "--data.source_len 4; raise --data.source_len, or cut long fields with --data.truncate true");
  EXPECT_EQ(error("p.jsonl", two + "{\"source\": [4, 0, 1], \"target\": \"b\"}\n"),
            prefix + jl + ": row 2 (line 3): field 'source' holds id 0 at position 1; ids are positive (0 is padding)");
  EXPECT_EQ(error("p.jsonl", two + "{\"source\": \"a\", \"target\": \"b\"\n")
                .rfind(prefix + jl + ": row 2 (line 3): is not JSON (", 0),
            0u);
  EXPECT_EQ(error("p.csv", "source,answer\na,b\n"),
            prefix + csv +
                ": the header (line 1) has no column 'target', only 'source', 'answer'; name the columns "
                "with --data.source_field / --data.target_field");
  EXPECT_EQ(error("p.csv", "target,source\na,b\nc\n"),
            prefix + csv + ": row 2 (line 3): no field 'source': the row has 1 column(s), the header 2");
  EXPECT_EQ(error("p.csv", "source,target\n\"a,b\n"),
            prefix + csv + ": a quoted field opened on line 2 or later is never closed");
  EXPECT_EQ(error("p.jsonl", "\n \n"), prefix + jl + " holds no pairs (data.path)");
}

}  // namespace
}  // namespace fsdpx
