// The vit model and the images data source, through the plugin host: what a batch holds, and a
// clear error for every bad input. Their numerics against vit-pytorch and transformers are
// tests/hf/vit_interop_test.py's; their training, tests/hf/vit_digits_test.py's.
#include <cmath>

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include "fsdpx/data_source.h"
#include "fsdpx/evaluation.h"
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/hf_interop.h"
#include "fsdpx/model.h"
#include "fsdpx/safetensors_file.h"
#include "test_paths.h"

namespace fsdpx {
namespace {

using test::error_of;

class VitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host.load_file(test::plugin_dir() / "data_images.so");
    host.load_file(test::plugin_dir() / "model_vit.so");
  }
  // A safetensors file of the named tensors.
  std::string file(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
    const std::string path = (dir.path() / ("f" + std::to_string(files++) + ".safetensors")).string();
    std::vector<SafetensorsWriter::Spec> specs;
    for (const auto& [name, t] : tensors) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
    SafetensorsWriter w(path, specs, {});
    for (const auto& [name, t] : tensors) w.write(t.contiguous());
    w.close();
    return path;
  }
  std::shared_ptr<DataSource> images(const std::string& path, std::map<std::string, std::string> o = {}) {
    o["path"] = path;
    return host.create<DataSource>("images", o);
  }
  PluginHost host;
  test::TempDir dir;
  int files = 0;
};

// 10 images [10, 3, 2, 2] whose pixel (n, c, y, x) is 12n + 4c + 2y + x, labels n % 4.
at::Tensor pixels() { return at::arange(120, at::kByte).reshape({10, 3, 2, 2}); }
at::Tensor labels() { return at::arange(10, at::kLong).remainder(4); }

TEST_F(VitTest, ImagesAreScaledNormalisedAndSplitAsEveryLayoutGivesThem) {
  const std::string nchw = file({{"images", pixels()}, {"labels", labels()}});
  const std::string nhwc = file({{"images", pixels().permute({0, 2, 3, 1})}, {"labels", labels()}});
  auto a = images(nchw, {{"mean", "0.5"}, {"std", "0.5,0.25,1"}, {"holdout", "0.2"}});
  auto b = images(nhwc, {{"mean", "0.5"}, {"std", "0.5,0.25,1"}, {"holdout", "0.2"}});
  EXPECT_EQ(a->num_samples(), 8);
  auto* held = dynamic_cast<HeldOutData*>(a.get());
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->num_heldout(), 2);
  a->open(DataContext{0, 2, 2, 9});
  b->open(DataContext{0, 2, 2, 9});
  const Batch x = a->next(), y = b->next();
  ASSERT_EQ(x.inputs.sizes(), (std::vector<int64_t>{2, 3, 2, 2}));
  EXPECT_TRUE(x.inputs.equal(y.inputs));  // [N, H, W, C] laid out as [N, C, H, W]
  EXPECT_EQ(x.samples, 2);
  // Each image is the stored one, scaled to 0..1 and normalised per channel.
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t label = x.targets[i].item<int64_t>();
    const float first = x.inputs[i][0][0][0].item<float>() * 0.5f + 0.5f;  // pixel (n, 0, 0, 0) / 255
    const int64_t image = static_cast<int64_t>(std::lround(first * 255.0f)) / 12;
    EXPECT_EQ(label, image % 4);
    const std::vector<float> sd{0.5f, 0.25f, 1.0f};
    for (int64_t c = 0; c < 3; ++c)
      EXPECT_FLOAT_EQ(x.inputs[i][c][1][1].item<float>(),
                      (static_cast<float>(12 * image + 4 * c + 3) / 255.0f - 0.5f) / sd[static_cast<size_t>(c)]);
  }
  // Another rank's images are others of the same step; a restored position goes on alike.
  auto other = images(nchw, {{"mean", "0.5"}, {"std", "0.5,0.25,1"}, {"holdout", "0.2"}});
  other->open(DataContext{1, 2, 2, 9});
  const Batch z = other->next();
  ASSERT_EQ(z.inputs.size(0), 2);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j) EXPECT_FALSE(z.inputs[i].equal(x.inputs[j]));
  auto resumed = images(nchw, {{"mean", "0.5"}, {"std", "0.5,0.25,1"}, {"holdout", "0.2"}});
  resumed->open(DataContext{0, 2, 2, 9});
  resumed->restore(a->state());
  EXPECT_TRUE(resumed->next().inputs.equal(a->next().inputs));
  EXPECT_EQ(held->heldout(0, 2).inputs.size(0), 2);
  // The SDK's reader the source is built on: the file's tensors, their dtypes and shapes.
  const auto tensors = safetensors_tensors(nhwc);
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors.at("images").dtype, at::kByte);
  EXPECT_EQ(tensors.at("images").shape, (std::vector<int64_t>{10, 2, 2, 3}));
  EXPECT_EQ(tensors.at("labels").dtype, at::kLong);
}

TEST_F(VitTest, BadImagesAreNamed) {
  const std::string ok = file({{"images", pixels()}, {"labels", labels()}});
  EXPECT_NE(error_of([&] { images(""); }).find("give the images' safetensors file with --data.path"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              images(ok, {{"images_key", "pixels"}});
            }).find("has no tensor 'pixels'; it holds images, labels"),
            std::string::npos);
  const std::string flat = file({{"images", pixels().reshape({10, 12})}, {"labels", labels()}});
  EXPECT_NE(error_of([&] { images(flat); }).find("has shape [10, 12], not [N, C, H, W] or [N, H, W, C]"),
            std::string::npos);
  const std::string ambiguous =
      file({{"images", at::zeros({4, 3, 5, 3}, at::kByte)}, {"labels", labels().narrow(0, 0, 4)}});
  EXPECT_NE(error_of([&] { images(ambiguous); }).find("say which with --data.layout nchw or nhwc"), std::string::npos);
  EXPECT_NO_THROW(images(ambiguous, {{"layout", "nchw"}}));
  const std::string few = file({{"images", pixels()}, {"labels", labels().narrow(0, 0, 9)}});
  EXPECT_NE(error_of([&] { images(few); }).find("give one integer label per image (10)"), std::string::npos);
  const std::string real = file({{"images", pixels()}, {"labels", labels().to(at::kFloat)}});
  EXPECT_NE(error_of([&] { images(real); }).find("and dtype Float; give one integer label per image"),
            std::string::npos);
  const std::string negative = file({{"images", pixels()}, {"labels", labels() - 1}});
  EXPECT_NE(error_of([&] { images(negative); }).find("label -1 is negative"), std::string::npos);
  const std::string ints = file({{"images", pixels().to(at::kInt)}, {"labels", labels()}});
  EXPECT_NE(error_of([&] { images(ints); }).find("images of dtype Int; give uint8 pixels"), std::string::npos);
  EXPECT_NE(error_of([&] {
              images(ok, {{"std", "1,2"}});
            }).find("data.std has 2 values, the images have 3 channels"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              images(ok, {{"std", "0"}});
            }).find("data.std holds '0', not a positive number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { images((dir.path() / "none.safetensors").string()); }).find("none.safetensors"),
            std::string::npos);
}

TEST_F(VitTest, ConfigurationsThatCannotBeBuiltAreNamed) {
  auto vit = [&](const std::map<std::string, std::string>& o) { return host.create<Model>("vit", o); };
  EXPECT_NE(error_of([&] {
              vit({{"image", "10"}, {"patch", "4"}});
            }).find("image 10 is not a whole number of patches of 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              vit({{"dim", "30"}, {"heads", "4"}});
            }).find("dim 30 does not split into 4 heads"),
            std::string::npos);
  EXPECT_NO_THROW(vit({{"dim", "30"}, {"heads", "4"}, {"head_dim", "8"}}));
  EXPECT_NE(error_of([&] {
              vit({{"size", "tiny"}, {"from_hf", dir.path().string()}});
            }).find("--model.size conflicts with --model.from_hf"),
            std::string::npos);
  EXPECT_NE(error_of([&] { vit({{"from_hf", dir.path().string()}}); }).find("no config.json there"), std::string::npos);
  // DeepViT (re-attention) has no Hugging Face counterpart: its config.json is refused by name.
  auto deep = vit({{"reattention", "true"}});
  auto* hf = dynamic_cast<HuggingFaceModel*>(deep.get());
  ASSERT_NE(hf, nullptr);
  EXPECT_NE(error_of([&] { hf->hf_config_json(); }).find("this vit has no Hugging Face counterpart"),
            std::string::npos);
  EXPECT_NE(error_of([&] { hf->hf_name("blocks.0.attention.reattn_weights"); }).find("has no Hugging Face name"),
            std::string::npos);
  // The 8B DeepViT plans without memory: its parameters are deferred.
  size_t params = 0;
  for (const auto& p : vit({{"size", "deepvit-8b"}})->module()->parameters()) params += static_cast<size_t>(p.numel());
  EXPECT_EQ(params, 7998277352u);
}

// Wrong data for the model: one line naming what it expects (fsdpx-train, 2 ranks).
TEST_F(VitTest, DataTheModelCannotTakeIsNamed) {
  const std::string rgb = file({{"images", at::zeros({8, 3, 8, 8}, at::kByte)}, {"labels", labels().narrow(0, 0, 8)}});
  auto r =
      test::run_command(test::train() + " --nproc-per-node 2 --model.name vit --data.name images --data.path " + rgb +
                        " --steps 1 --batch-size 2 --checkpoint.name none --out " + (dir.path() / "a").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("vit expects images [batch, 1, 8, 8], the data gives [2, 3, 8, 8]"), std::string::npos) << r.err;
  const std::string many =
      file({{"images", at::zeros({8, 1, 8, 8}, at::kByte)}, {"labels", at::full({8}, 12, at::kLong)}});
  r = test::run_command(test::train() + " --nproc-per-node 2 --model.name vit --data.name images --data.path " + many +
                        " --steps 1 --batch-size 2 --checkpoint.name none --out " + (dir.path() / "b").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("vit has 10 classes (labels 0..9) but the data has label 12; set --model.classes 13"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace fsdpx
