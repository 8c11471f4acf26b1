// The library's bad input, per-unit settings and checkpoints under torchrun (tests/unit/
// library_test.cpp): a small torch::nn model of 3 Blocks (or, --mlp, one with the parameter names
// and shapes of fsdpx-train's mlp model) sharded with fsdpx::fully_shard and trained 3 steps with
// SGD (--mlp: AdamW); rank 0 prints each step's loss (rank 0's part of the batch).
//   library_worker [--seed-by-rank] [--reshard UNIT=true|false|K ...] [--rank0-reshard UNIT=K]
//                  [--sharding NAME] [--mlp] [--save DIR [--save-after N] [--async]]
//                  [--device cpu|sim|cuda] [--recompute [--offload]] [--touch-inputs]
// --seed-by-rank seeds each rank with its rank, and --rank0-reshard gives rank 0 alone one more
// reshard_after_forward: the mistakes fully_shard must refuse. Rank 0 prints
// the bytes the engine holds between each forward and its backward. --save writes
// a sharded checkpoint after step N (3: the last), --async in the background while the steps
// after it run.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "fsdpx/framework/trainer/fully_shard.h"
#include "fsdpx/unit.h"
#include "tool.h"

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl() : torch::nn::Module("Block") {
    up = register_module("up", torch::nn::Linear(16, 32));
    down = register_module("down", torch::nn::Linear(32, 16));
  }
  at::Tensor forward(at::Tensor x) { return x + down(torch::tanh(up(x))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
FSDPX_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block()));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& b : blocks) {
      at::Tensor y = b(x);
      if (touch_inputs && x.requires_grad()) x.mul_(1);  // the block's input, changed in place after it ran
      x = y;
    }
    return x;
  }
  std::vector<Block> blocks;
  bool touch_inputs = false;
};
TORCH_MODULE(Net);

// fsdpx-train's mlp model (plugins/model/mlp) with its defaults, written with torch::nn: the same
// parameter names and shapes, so that a checkpoint of one loads in the other.
struct HiddenImpl : torch::nn::Module {
  HiddenImpl(int64_t in, int64_t out) : torch::nn::Module("Hidden") {
    weight = register_parameter("weight", torch::randn({out, in}) * std::sqrt(2.0 / double(in)));
    bias = register_parameter("bias", torch::zeros({out}));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::relu(torch::nn::functional::linear(x, weight, bias)); }
  at::Tensor weight, bias;
};
FSDPX_MODULE(Hidden);

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    auto list = register_module("layers", torch::nn::ModuleList());
    for (int64_t in : {30, 64}) hidden.push_back(Hidden(in, 64)), list->push_back(hidden.back());
    head_weight = register_parameter("head_weight", torch::randn({2, 64}) / 8.0);
    head_bias = register_parameter("head_bias", torch::zeros({2}));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& h : hidden) x = h(x);
    return torch::nn::functional::linear(x, head_weight, head_bias);
  }
  std::vector<Hidden> hidden;
  at::Tensor head_weight, head_bias;
};
TORCH_MODULE(Mlp);

int run(const fsdpx::tool::po::variables_map& vm) {
  const char* rank_env = std::getenv("RANK");
  torch::manual_seed(vm.count("seed-by-rank") && rank_env ? std::atoi(rank_env) : 0);
  const bool mlp = vm.count("mlp") > 0;
  Net net{nullptr};
  Mlp mlp_net{nullptr};
  std::shared_ptr<torch::nn::Module> module;
  if (mlp) module = (mlp_net = Mlp()).ptr();
  else module = (net = Net()).ptr();
  if (net) net->touch_inputs = vm.count("touch-inputs") > 0;
  fsdpx::RuntimeSettings settings;
  settings.device = vm["device"].as<std::string>();
  fsdpx::Runtime rt(settings);
  fsdpx::ShardOptions o;
  o.sharding = vm["sharding"].as<std::string>();
  o.wrap_options = {{"layer_types", mlp ? "Hidden" : "Block"}};
  if (vm.count("recompute")) o.wrap_options["activation_checkpointing"] = "true";
  if (vm.count("offload"))
    for (const char* unit : {"block0", "block1", "block2"}) o.activation_offload.insert(unit);
  std::vector<std::string> reshard = vm["reshard"].as<std::vector<std::string>>();
  if (vm.count("rank0-reshard") && rank_env && std::atoi(rank_env) == 0)
    reshard.push_back(vm["rank0-reshard"].as<std::string>());
  for (const std::string& kv : reshard) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("--reshard takes UNIT=true|false|K, got " + kv);
    const std::string v = kv.substr(eq + 1);
    if (v == "true" || v == "false") o.reshard_after_forward[kv.substr(0, eq)] = v == "true";
    else o.reshard_after_forward[kv.substr(0, eq)] = std::stoi(v);
  }
  auto fsdp = fsdpx::fully_shard(rt, module, o);
  auto opt = mlp ? fsdp->optimizer("adamw", {{"lr", "0.01"}}) : fsdp->optimizer("sgd", {{"lr", "0.1"}});
  for (int step = 0; step < 3; ++step) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(100 + step);
    const at::Tensor x = at::randn({8, mlp ? 30 : 16}, g), y = (x.sum(1) > 0).to(at::kLong);
    const int64_t n = 8 / rt.world_size();
    const at::Tensor mine = x.narrow(0, rt.rank() * n, n).to(rt.device()),
                     labels = y.narrow(0, rt.rank() * n, n).to(rt.device());
    at::Tensor loss = fsdp->forward([&] {
      return mlp ? torch::cross_entropy_loss(mlp_net->forward(mine), labels) : net->forward(mine).sin().pow(2).mean();
    });
    const fsdpx::MemoryReport held = fsdp->memory();
    if (rt.rank() == 0)
      std::printf("step %d after forward: gathered %lld B, kept %lld B\n", step, (long long)held.unsharded_bytes,
                  (long long)held.post_forward_bytes);
    fsdp->backward(loss);
    opt->step(opt->base_lr());
    fsdp->zero_grad();
    if (rt.rank() == 0) std::printf("step %d loss %.9g\n", step, loss.item<double>());
    if (vm.count("save") && step + 1 == vm["save-after"].as<int>())
      fsdp->save(vm["save"].as<std::string>(), *opt, step + 1, "sharded",
                 {{"async", vm.count("async") ? "true" : "false"}});
  }
  fsdp->wait_for_save();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = fsdpx::tool::po;
  po::options_description desc;
  desc.add_options()("seed-by-rank", "each rank seeds its module with its rank (refused)")
      ("reshard", po::value<std::vector<std::string>>()->default_value({}, ""),
       "UNIT=true|false|K: reshard_after_forward")
      ("rank0-reshard", po::value<std::string>(), "UNIT=true|false|K on rank 0 alone (refused)")
      ("sharding", po::value<std::string>()->default_value("full_shard"), "a sharding plugin")
      ("mlp", "fsdpx-train's mlp model, trained with AdamW")
      ("save", po::value<std::string>(), "a sharded checkpoint here")
      ("save-after", po::value<int>()->default_value(3), "the step whose state --save writes")
      ("async", "--save in the background (the sharded plugin's async option)")
      ("device", po::value<std::string>()->default_value("cpu"), "cpu, sim or cuda (RuntimeSettings::device)")
      ("recompute", "every Block recomputes its activations in backward (the wrap's activation_checkpointing)")
      ("offload", "and its inputs go to host memory in between (ShardOptions::activation_offload)")
      ("touch-inputs", "the model changes each block's input in place after the block ran (refused with --offload)");
  fsdpx::tool::main(argc, argv, "library_worker", desc, run);
}
