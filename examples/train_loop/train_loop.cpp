// A torch::nn model trained in a plain LibTorch loop, and the same loop sharded by fsdpx: the
// lines marked "fsdpx" are all it adds (--plain runs the loop without them, in one process).
//   train_loop [--plain] [--sharding full_shard|shard_grad_op|hybrid_shard|cpu_offload]
//              [--option KEY=VALUE ...] [--device cpu|sim|cuda] [--steps N]
// Each rank prints its loss on its part of the global batch of 16 samples at each step, and at
// the end the bytes of the parameters it holds against the model's.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include <torch/torch.h>

#include "fsdpx/framework/trainer/fully_shard.h"  // fsdpx
#include "fsdpx/unit.h"                            // fsdpx

struct BlockImpl : torch::nn::Module {
  BlockImpl() : torch::nn::Module("Block") {
    up = register_module("up", torch::nn::Linear(32, 64));
    down = register_module("down", torch::nn::Linear(64, 32));
  }
  at::Tensor forward(at::Tensor x) { return x + down(torch::gelu(up(x))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
FSDPX_MODULE(Block);  // fsdpx: was TORCH_MODULE(Block)

struct NetImpl : torch::nn::Module {
  NetImpl() {
    for (int i = 0; i < 4; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block()));
    head = register_module("head", torch::nn::Linear(32, 1));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return head(x);
  }
  std::vector<Block> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  std::string sharding = "full_shard", device = "cpu";
  std::map<std::string, std::string> options;  // the sharding plugin's (fsdpx-plugins show NAME)
  bool plain = false;
  int steps = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--plain")) plain = true;
    else if (!std::strcmp(argv[i], "--sharding") && i + 1 < argc) sharding = argv[++i];
    else if (!std::strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!std::strcmp(argv[i], "--option") && i + 1 < argc && std::strchr(argv[i + 1], '=')) {
      const std::string kv = argv[++i];
      options[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
    }
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::stoi(argv[++i]);
    else return std::fprintf(stderr, "train_loop: unknown argument %s\n", argv[i]), 2;
  }
  try {
    torch::manual_seed(0);  // the same initial weights on every rank
    Net net;
    int64_t model_bytes = 0;
    for (const auto& p : net->parameters()) model_bytes += p.numel() * p.element_size();
    std::unique_ptr<fsdpx::Runtime> rt;          // fsdpx
    std::unique_ptr<fsdpx::ShardedModule> fsdp;  // fsdpx
    std::shared_ptr<fsdpx::Optimizer> opt;       // fsdpx
    std::unique_ptr<torch::optim::SGD> plain_opt;
    if (plain) {
      plain_opt = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.05));
    } else {
      rt = std::make_unique<fsdpx::Runtime>(fsdpx::RuntimeSettings{device});  // fsdpx, and the next 2 lines
      fsdp = fsdpx::fully_shard(*rt, net.ptr(), {sharding, options, "layer_type", {{"layer_types", "Block"}}});
      opt = fsdp->optimizer("sgd", {{"lr", "0.05"}});
    }
    const int rank = rt ? rt->rank() : 0, world = rt ? rt->world_size() : 1;
    const c10::Device dev = rt ? rt->device() : c10::Device(c10::kCPU);
    for (int step = 0; step < steps; ++step) {
      auto g = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
      const at::Tensor x = at::randn({16, 32}, g), y = x.sum(1, true).sin();
      const int64_t n = 16 / world;  // this rank's part of the global batch
      const at::Tensor xs = x.narrow(0, rank * n, n).to(dev), ys = y.narrow(0, rank * n, n).to(dev);
      auto loss_of = [&] { return torch::mse_loss(net->forward(xs), ys); };
      at::Tensor loss;
      if (plain) {
        loss = loss_of();
        plain_opt->zero_grad();
        loss.backward();
        plain_opt->step();
      } else {
        loss = fsdp->forward(loss_of);  // fsdpx
        fsdp->backward(loss);           // fsdpx
        opt->step(opt->base_lr());      // fsdpx
        fsdp->zero_grad();              // fsdpx
      }
      std::printf("rank %d step %d loss %.9g\n", rank, step, loss.item<double>());
    }
    std::printf("rank %d holds %lld parameter bytes of the model's %lld\n", rank,
                static_cast<long long>(fsdp ? fsdp->memory().param_bytes : model_bytes),
                static_cast<long long>(model_bytes));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_loop: %s\n", e.what());
    return 1;
  }
  return 0;
}
