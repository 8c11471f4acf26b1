// Data plugins: tokens (nanoGPT's binary format) and synthetic, through the plugin host.
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "fsdpx/data_source.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "test_paths.h"

namespace fsdpx {
namespace {

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host.load_file(test::plugin_dir() / "data_tokens.so");
    host.load_file(test::plugin_dir() / "data_synthetic.so");
  }
  PluginHost host;
  test::TempDir dir;
};

std::set<std::vector<int64_t>> rows_of(const at::Tensor& t) {
  std::set<std::vector<int64_t>> out;
  for (int64_t i = 0; i < t.size(0); ++i) {
    at::Tensor r = t[i].contiguous();
    out.insert(std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()));
  }
  return out;
}

TEST_F(DataTest, TokensReadsSamplesOfSeqPlusOne) {
  const auto path = dir.path() / "train.bin";
  {
    std::ofstream out(path, std::ios::binary);
    for (uint16_t v = 0; v < 1001; ++v) out.write(reinterpret_cast<const char*>(&v), 2);
  }
  auto make = [&] { return host.create<DataSource>("tokens", {{"path", path.string()}, {"seq", "4"}}); };
  auto a = make();
  EXPECT_EQ(a->num_samples(), 250);  // (1001 - 1) / 4
  a->open(DataContext{0, 2, 3, 11});
  Batch b = a->next();
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{3, 4}));
  for (int64_t i = 0; i < 3; ++i) {
    const int64_t first = b.inputs[i][0].item<int64_t>();
    EXPECT_EQ(first % 4, 0);  // samples start on multiples of seq
    for (int64_t k = 0; k < 4; ++k) {
      EXPECT_EQ(b.inputs[i][k].item<int64_t>(), first + k);
      EXPECT_EQ(b.targets[i][k].item<int64_t>(), first + k + 1);  // the next token
    }
  }
  // The other rank reads the other half of the same global batch.
  auto other = make();
  other->open(DataContext{1, 2, 3, 11});
  auto mine = rows_of(b.inputs), theirs = rows_of(other->next().inputs);
  for (const auto& r : theirs) EXPECT_EQ(mine.count(r), 0u);
  // Resume from a saved position.
  auto resumed = make();
  resumed->open(DataContext{0, 2, 3, 11});
  resumed->restore(a->state());
  EXPECT_TRUE(resumed->next().inputs.equal(a->next().inputs));
}

TEST_F(DataTest, SyntheticGivesTheSameGlobalBatchAtEveryWorldSize) {
  std::set<std::vector<int64_t>> one, two;
  auto s1 = host.create<DataSource>("synthetic", {{"samples", "64"}, {"seq", "8"}});
  s1->open(DataContext{0, 1, 8, 5});
  one = rows_of(s1->next().inputs);
  for (int r = 0; r < 2; ++r) {
    auto s = host.create<DataSource>("synthetic", {{"samples", "64"}, {"seq", "8"}});
    s->open(DataContext{r, 2, 4, 5});
    for (const auto& row : rows_of(s->next().inputs)) two.insert(row);
  }
  EXPECT_EQ(one, two);
}

TEST_F(DataTest, BadInput) {
  EXPECT_EQ(test::error_of([&] { host.create<DataSource>("tokens", {{"path", "/nonexistent/train.bin"}}); }),
            "data source 'tokens' (plugin data_tokens): data.path /nonexistent/train.bin does not exist");
  const auto odd = dir.path() / "odd.bin";
  test::write_file(odd, "abc");
  EXPECT_EQ(test::error_of([&] { host.create<DataSource>("tokens", {{"path", odd.string()}}); }),
            "data source 'tokens' (plugin data_tokens): token file " + odd.string() +
                " has 3 bytes, not a whole number of 2-byte tokens; is data.dtype right?");
  EXPECT_EQ(test::error_of([&] { host.create<DataSource>("tokens"); }),
            "data source 'tokens' (plugin data_tokens): path is empty; give the token file with --data.path FILE");
  auto s = host.create<DataSource>("synthetic", {{"samples", "10"}});
  EXPECT_EQ(test::error_of([&] { s->open(DataContext{0, 2, 8, 1}); }),
            "the global batch (16 samples: batch size per rank x 2 ranks) is larger than the data set (10 samples); "
            "lower --batch-size or use more data");
}

}  // namespace
}  // namespace fsdpx
