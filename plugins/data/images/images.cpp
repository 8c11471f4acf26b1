// images: image classification from one safetensors file: a tensor of images, uint8 pixels
// (0..255) or float values, as [N, C, H, W] or [N, H, W, C], and a tensor of N integer labels.
// scripts/images_to_safetensors.py writes one from a folder of images in class-per-folder layout
// or from scikit-learn's digits. Images are split once, from split_seed alone, into training and
// held-out ones; a batch is [B, C, H, W] fp32, uint8 pixels scaled to 0..1, then (x - mean) / std
// per channel. No random crops or flips: each image is seen as stored.
#include <cmath>
#include <cstdlib>

#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>

#include <fsdpx/data_source.h>
#include <fsdpx/error.h>
#include <fsdpx/evaluation.h>
#include <fsdpx/files.h>
#include <fsdpx/plugin.h>
#include <fsdpx/safetensors_file.h>
#include <fsdpx/sampler.h>

namespace {

// Per-channel values of the list option `name` (one value: every channel's), as a [1, C, 1, 1]
// tensor; fsdpx::Error naming the option when it is neither one value nor one per channel.
at::Tensor per_channel(const fsdpx::Options& o, const std::string& name, int64_t channels, bool positive) {
  std::vector<float> v;
  for (const std::string& s : o.get_list(name)) {
    char* end = nullptr;
    const float f = std::strtof(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(f) || (positive && f <= 0))
      throw fsdpx::Error("data." + name + " holds '" + s + "', not a " + (positive ? "positive " : "") + "number");
    v.push_back(f);
  }
  if (v.size() == 1) v.assign(static_cast<size_t>(channels), v[0]);
  if (static_cast<int64_t>(v.size()) != channels)
    throw fsdpx::Error("data." + name + " has " + std::to_string(o.get_list(name).size()) +
                       " values, the images have " + std::to_string(channels) +
                       " channels; give one value, or one per channel");
  return at::tensor(v, at::kFloat).reshape({1, channels, 1, 1});
}

bool is_channels(int64_t n) { return n == 1 || n == 3 || n == 4; }

class Images final : public fsdpx::DataSource, public fsdpx::HeldOutData {
 public:
  Images(const fsdpx::Options& o) {
    const std::string path = o.get_string("path");
    if (path.empty()) throw fsdpx::Error("path is empty; give the images' safetensors file with --data.path FILE");
    const std::string where = "images file " + path + " (data.path)";
    // Held whole in memory, and once more while an [N, H, W, C] file is laid out as [N, C, H, W].
    fsdpx::check_fits_in_memory(2 * fsdpx::check_input_file(path, "data.path"), where, "give a smaller file");
    at::Tensor images = fsdpx::read_safetensors_tensor(path, o.get_string("images_key"));
    at::Tensor labels = fsdpx::read_safetensors_tensor(path, o.get_string("labels_key"));
    if (images.dim() != 4)
      throw fsdpx::Error(where + ": '" + o.get_string("images_key") + "' has shape " + c10::str(images.sizes()) +
                         ", not [N, C, H, W] or [N, H, W, C]");
    if (images.scalar_type() != at::kByte && !at::isFloatingType(images.scalar_type()))
      throw fsdpx::Error(where + ": images of dtype " + std::string(c10::toString(images.scalar_type())) +
                         "; give uint8 pixels (0..255) or floating-point values");
    std::string layout = o.get_string("layout");
    if (layout == "auto") {
      const bool first = is_channels(images.size(1)), last = is_channels(images.size(3));
      if (first == last)
        throw fsdpx::Error(where + ": images of shape " + c10::str(images.sizes()) +
                           " could be [N, C, H, W] or [N, H, W, C]; say which with --data.layout nchw or nhwc");
      layout = first ? "nchw" : "nhwc";
    }
    if (layout == "nhwc") images = images.permute({0, 3, 1, 2});
    images_ = images.contiguous();
    scale_ = images_.scalar_type() == at::kByte ? 1.0 / 255.0 : 1.0;
    if (labels.dim() != 1 || labels.size(0) != images_.size(0) || labels.is_floating_point() ||
        labels.scalar_type() == at::kBool)
      throw fsdpx::Error(where + ": '" + o.get_string("labels_key") + "' has shape " + c10::str(labels.sizes()) +
                         " and dtype " + std::string(c10::toString(labels.scalar_type())) +
                         "; give one integer label per image (" + std::to_string(images_.size(0)) + ")");
    labels_ = labels.to(at::kLong);
    if (labels_.numel() > 0 && labels_.min().item<int64_t>() < 0)
      throw fsdpx::Error(where + ": label " + std::to_string(labels_.min().item<int64_t>()) +
                         " is negative; labels are class indices 0, 1, ...");
    const int64_t channels = images_.size(1);
    mean_ = per_channel(o, "mean", channels, false);
    std_ = per_channel(o, "std", channels, true);
    split_ = std::make_unique<fsdpx::SplitSamples>(images_.size(0), o.get_float("holdout"),
                                                   static_cast<uint64_t>(o.get_int("split_seed")), "images");
    if (split_->training() < 1)
      throw fsdpx::Error(where + " leaves no training images with data.holdout " +
                         std::to_string(o.get_float("holdout")) + " (" + std::to_string(images_.size(0)) + " images)");
  }

  void open(const fsdpx::DataContext& ctx) override {
    split_->open(ctx.batch_size, ctx.rank, ctx.world_size, ctx.seed);
  }
  fsdpx::Batch next() override { return batch_of(split_->next()); }
  int64_t num_samples() const override { return split_->training(); }
  std::string state() const override { return split_->state(); }
  void restore(const std::string& s) override { split_->restore(s); }

  int64_t num_heldout() const override { return split_->held_out(); }
  fsdpx::Batch heldout(int64_t first, int64_t count) override { return batch_of(split_->heldout(first, count)); }

 private:
  fsdpx::Batch batch_of(std::vector<int64_t> idx) {
    const at::Tensor index = at::tensor(idx, at::kLong);
    fsdpx::Batch b;
    b.inputs = ((images_.index_select(0, index).to(at::kFloat) * scale_ - mean_) / std_).contiguous();
    b.targets = labels_.index_select(0, index);
    b.samples = b.tokens = static_cast<int64_t>(idx.size());
    return b;
  }

  at::Tensor images_, labels_, mean_, std_;
  double scale_ = 1.0;
  std::unique_ptr<fsdpx::SplitSamples> split_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::DataSource>(
      "images", "image classification: a safetensors file of images and labels (scripts/images_to_safetensors.py)",
      {fsdpx::string_option("path", "", "the safetensors file"),
       fsdpx::string_option("images_key", "images",
                            "its tensor of images, uint8 or float, [N, C, H, W] or [N, H, W, C]"),
       fsdpx::string_option("labels_key", "labels", "its tensor of N integer labels"),
       fsdpx::choice_option("layout", "auto", {"auto", "nchw", "nhwc"},
                            "the images' layout (auto: where the dimension of 1, 3 or 4 channels is)"),
       fsdpx::list_option("mean", "0.5", "per-channel mean subtracted, on the 0..1 scale (one value: every channel's)"),
       fsdpx::list_option("std", "0.5",
                          "per-channel deviation divided by, on the 0..1 scale (one value: every channel's)"),
       fsdpx::float_option("holdout", 0.2, fsdpx::FloatRange::closed(0, 0.9),
                           "fraction of the images held out for evaluation"),
       fsdpx::int_option("split_seed", 0, fsdpx::IntRange{0},
                         "seed of the train/held-out split (independent of the run's seed)")},
      [](const fsdpx::ComponentContext& ctx) { return std::make_shared<Images>(ctx.options); });
}

}  // namespace

FSDPX_PLUGIN("data_images", "0.1.0", register_components)
