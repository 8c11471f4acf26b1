// A torch::nn model trained in a plain LibTorch loop, and the same loop sharded by fsdpx: the
// lines marked "fsdpx" are all it adds (--plain runs the loop without them, in one process). The
// optimizer is torch::optim's SGD over net->parameters(), which after fully_shard are this rank's
// shards, and the backward is loss.backward(), as with FSDP2.
//   train_loop [--plain] [--sharding full_shard|shard_grad_op|hybrid_shard|cpu_offload]
//              [--option KEY=VALUE ...] [--device cpu|sim|cuda] [--steps N] [--prefetch N]
//              [--load DIR] [--save DIR] [--halve-head]
// Each rank prints its loss on its part of the global batch of 12 samples at each step, and at
// the end the bytes of the parameters it holds against the model's. --load starts from a
// checkpoint (at its step), --save writes one after the last step; --halve-head then halves the
// head's weight (fsdpx: inside a writable summon_full_params) and prints the sum of every weight
// and the loss of the next batch.
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include <torch/torch.h>

#include <fsdpx/fsdpx.h>  // fsdpx

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

// Halves the head's weight, then prints the sum of every weight and the next batch's loss: with
// fsdpx, the write goes through a writable summon_full_params and reaches every rank's shards.
void halve_head(Net& net, fsdpx::ShardedModule* fsdp, const std::pair<at::Tensor, at::Tensor>& b, int rank) {
  torch::NoGradGuard no_grad;
  double sum = 0;
  if (fsdp) {
    { fsdp->summon_full_params(/*writable=*/true)["head.weight"].mul_(0.5); }
    for (const auto& [name, t] : fsdp->summon_full_params().all()) sum += t.sum().item<double>();
  } else {
    net->head->weight.mul_(0.5);
    for (const auto& p : net->parameters()) sum += p.sum().item<double>();
  }
  auto loss_of = [&] { return torch::mse_loss(net->forward(b.first), b.second); };
  const at::Tensor loss = fsdp ? fsdp->forward(loss_of) : loss_of();
  std::printf("rank %d weights sum %.9g next loss %.9g\n", rank, sum, loss.item<double>());
}

struct Args {
  bool plain = false, halve_head = false;
  std::string sharding = "full_shard", device = "cpu", load, save;
  std::map<std::string, std::string> options;  // the sharding plugin's (fsdpx-plugins show NAME)
  int steps = 5, prefetch = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i], next = i + 1 < argc ? argv[i + 1] : "";
    if (arg == "--plain") a.plain = true;
    else if (arg == "--halve-head") a.halve_head = true;
    else if (next.empty()) throw std::invalid_argument("unknown argument or no value: " + arg);
    else if (arg == "--sharding") a.sharding = argv[++i];
    else if (arg == "--device") a.device = argv[++i];
    else if (arg == "--load") a.load = argv[++i];
    else if (arg == "--save") a.save = argv[++i];
    else if (arg == "--steps") a.steps = std::stoi(argv[++i]);
    else if (arg == "--prefetch") a.prefetch = std::stoi(argv[++i]);
    else if (arg == "--option" && next.find('=') != std::string::npos)
      a.options[next.substr(0, next.find('='))] = next.substr(next.find('=') + 1), ++i;
    else throw std::invalid_argument("unknown argument: " + arg);
  }
  return a;
}

// The global batch of step `step`, the same on every rank; this rank's part of it on `dev`.
std::pair<at::Tensor, at::Tensor> batch(int step, int rank, int world, const c10::Device& dev) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  const at::Tensor x = at::randn({12, 32}, g), y = x.sum(1, true).sin();
  const int64_t n = 12 / world;
  return {x.narrow(0, rank * n, n).to(dev), y.narrow(0, rank * n, n).to(dev)};
}

void run(const Args& a) {
  auto rt = a.plain ? nullptr : std::make_unique<fsdpx::Runtime>(fsdpx::RuntimeSettings{a.device});  // fsdpx
  const int rank = rt ? rt->rank() : 0, world = rt ? rt->world_size() : 1;                          // fsdpx
  const c10::Device dev = rt ? rt->device() : c10::Device(c10::kCPU);                               // fsdpx
  torch::manual_seed(0);  // the same initial weights on every rank
  Net net;
  int64_t model_bytes = 0;
  for (const auto& p : net->parameters()) model_bytes += p.numel() * p.element_size();
  auto options = fsdpx::ShardOptions().with_sharding(a.sharding, a.options).with_prefetch(a.prefetch);  // fsdpx
  auto fsdp = rt ? fsdpx::fully_shard(*rt, net.ptr(), options.wrap_layer_types("Block")) : nullptr;    // fsdpx
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));  // with fsdpx: the shards
  int first = 0;
  if (!a.load.empty()) first = static_cast<int>(fsdp->load(a.load, opt));  // fsdpx: a checkpoint
  for (int step = first; step < a.steps; ++step) {
    const auto [xs, ys] = batch(step, rank, world, dev);
    auto loss_of = [&, &xs = xs, &ys = ys] { return torch::mse_loss(net->forward(xs), ys); };
    at::Tensor loss = fsdp ? fsdp->forward(loss_of) : loss_of();  // fsdpx: was loss_of()
    opt.zero_grad();
    loss.backward();
    opt.step();
    std::printf("rank %d step %d loss %.9g\n", rank, step, loss.item<double>());
  }
  if (!a.save.empty() && fsdp) fsdp->save(a.save, opt, a.steps);  // fsdpx: a checkpoint
  std::printf("rank %d holds %lld parameter bytes of the model's %lld\n", rank,
              static_cast<long long>(fsdp ? fsdp->memory().param_bytes : model_bytes),
              static_cast<long long>(model_bytes));
  if (a.halve_head) halve_head(net, fsdp.get(), batch(a.steps, rank, world, dev), rank);
}

int main(int argc, char** argv) {
  try {
    run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_loop: %s\n", e.what());
    return 1;
  }
  return 0;
}
