// mlp: a classifier for tabular data, the model of the cancer-classification example in PyTorch's
// FSDP tutorial: `layers` hidden layers of `hidden` units with ReLU, then a linear head to
// `classes` logits, trained with cross-entropy. Its hidden layer type "Hidden" is declared with
// FSDPX_MODULE, so layer_type can make each one a unit.
#include <cmath>

#include <ATen/ops/argmax.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/relu.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/container/modulelist.h>

#include <fsdpx/activation_memory.h>
#include <fsdpx/error.h>
#include <fsdpx/evaluation.h>
#include <fsdpx/model.h>
#include <fsdpx/plugin.h>
#include <fsdpx/unit.h>

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct HiddenImpl : torch::nn::Module {
  HiddenImpl(int64_t in, int64_t out) : torch::nn::Module("Hidden") {
    weight = register_parameter("weight", fsdpx::deferred_tensor({out, in}));
    bias = register_parameter("bias", fsdpx::deferred_tensor({out}));
  }
  at::Tensor forward(const at::Tensor& x) { return at::relu(at::linear(x, weight, bias)); }
  at::Tensor weight, bias;
};
FSDPX_MODULE(Hidden);

struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl(int64_t in, int64_t hidden, int64_t layers, int64_t classes) : torch::nn::Module("Classifier") {
    list = register_module("layers", torch::nn::ModuleList());
    int64_t width = in;
    for (int64_t i = 0; i < layers; ++i) {
      hidden_layers.emplace_back(width, hidden);
      list->push_back(hidden_layers.back());
      width = hidden;
    }
    head_weight = register_parameter("head_weight", fsdpx::deferred_tensor({classes, width}));
    head_bias = register_parameter("head_bias", fsdpx::deferred_tensor({classes}));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& h : hidden_layers) x = h(x);
    return at::linear(x, head_weight, head_bias);
  }
  torch::nn::ModuleList list{nullptr};
  std::vector<Hidden> hidden_layers;
  at::Tensor head_weight, head_bias;
};

class Mlp final : public fsdpx::Model, public fsdpx::Evaluable, public fsdpx::ActivationMemory {
 public:
  Mlp(int64_t in, int64_t hidden, int64_t layers, int64_t classes)
      : in_(in), classes_(classes), root_(std::make_shared<ClassifierImpl>(in, hidden, layers, classes)) {}

  std::shared_ptr<torch::nn::Module> module() override { return root_; }

  void init_parameter(const std::string& name, at::Tensor& param, at::Generator& gen) const override {
    at::NoGradGuard no_grad;
    if (ends_with(name, "bias")) {
      param.zero_();
    } else {
      // He initialisation for the ReLU layers, LeCun's for the head.
      const double fan_in = static_cast<double>(param.size(1));
      param.normal_(0.0, std::sqrt((ends_with(name, "head_weight") ? 1.0 : 2.0) / fan_in), gen);
    }
  }

  at::Tensor loss(const fsdpx::Batch& batch) override {
    return at::cross_entropy_loss(logits(batch), batch.targets);
  }

  fsdpx::EvalSums evaluate(const fsdpx::Batch& batch) override {
    at::Tensor l = logits(batch);
    fsdpx::EvalSums s;
    s.samples = batch.inputs.size(0);
    if (s.samples == 0) {
      s.correct = 0;
      return s;
    }
    s.loss_sum = at::cross_entropy_loss(l, batch.targets, {}, at::Reduction::Sum).item<double>();
    s.correct = at::argmax(l, 1).eq(batch.targets).sum().item<double>();
    return s;
  }

  std::vector<std::string> layer_types() const override { return {"Hidden"}; }

  // Each hidden layer keeps its ReLU's output (its linear's output is a temporary; the first
  // linear keeps the features, cast to the compute dtype); the head's loss keeps the fp32
  // log-probabilities, and its backward holds three B x classes fp32 tensors.
  std::vector<fsdpx::LayerActivations> activations(int64_t batch, int64_t, c10::ScalarType compute) const override {
    const int64_t e = static_cast<int64_t>(c10::elementSize(compute)), B = batch;
    std::vector<fsdpx::LayerActivations> out;
    int64_t width = in_;
    for (size_t i = 0; i < root_->hidden_layers.size(); ++i) {
      const int64_t h = root_->hidden_layers[i]->weight.size(0);
      const int64_t input = B * width * e, kept = B * h * e + (i == 0 ? input : 0);
      out.push_back({"layers." + std::to_string(i), kept, input, B * h * e, kept + 3 * B * h * e});
      width = h;
    }
    out.push_back(
        {"head_weight", 4 * B * classes_, B * width * e, 4 * B * classes_, 12 * B * classes_ + B * width * e});
    return out;
  }

 private:
  at::Tensor logits(const fsdpx::Batch& batch) {
    const at::Tensor& x = batch.inputs;
    if (x.dim() != 2 || x.size(1) != in_)
      throw fsdpx::Error("mlp expects batches of " + std::to_string(in_) + " features, the data gives shape " +
                         c10::str(x.sizes()) + "; set --model.in_features to the data's feature count");
    if (batch.targets.numel() > 0) {
      const int64_t hi = batch.targets.max().item<int64_t>(), lo = batch.targets.min().item<int64_t>();
      if (lo < 0 || hi >= classes_)
        throw fsdpx::Error("mlp has " + std::to_string(classes_) + " classes (labels 0.." +
                           std::to_string(classes_ - 1) + ") but the data has label " +
                           std::to_string(lo < 0 ? lo : hi) +
                           "; if the data's labels are right, set --model.classes " + std::to_string(hi + 1) +
                           "; if they are a feature, choose the label column (--data.label_column)");
    }
    // The features in the dtype the first layer computes in (bf16 under a mixed policy).
    const at::Tensor& w = root_->hidden_layers.empty() ? root_->head_weight : root_->hidden_layers[0]->weight;
    return root_->forward(x.to(w.scalar_type())).to(at::kFloat);
  }

  int64_t in_, classes_;
  std::shared_ptr<ClassifierImpl> root_;
};

void register_components(fsdpx::Registrar& r) {
  r.add<fsdpx::Model>(
      "mlp", "a classifier for tabular data: hidden ReLU layers and a linear head, cross-entropy",
      {fsdpx::int_option("in_features", 30, {1, 1 << 20}, "features per sample (the breast-cancer data has 30)"),
       fsdpx::int_option("hidden", 64, {1, 1 << 20}, "units per hidden layer"),
       fsdpx::int_option("layers", 2, {0, 1024}, "hidden layers"),
       fsdpx::int_option("classes", 2, {1, 1 << 24}, "output classes")},
      [](const fsdpx::ComponentContext& ctx) {
        const auto& o = ctx.options;  // each within its declared range
        return std::make_shared<Mlp>(o.get_int("in_features"), o.get_int("hidden"), o.get_int("layers"),
                                     o.get_int("classes"));
      });
}

}  // namespace

FSDPX_PLUGIN("model_mlp", "0.1.0", register_components)
