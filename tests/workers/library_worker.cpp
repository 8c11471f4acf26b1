// The library under torchrun (tests/unit/library_test.cpp): a small torch::nn model of 3 Blocks
// (or, --mlp, one with the parameter names and shapes of fsdpx-train's mlp model; --gpt, the gpt
// plugin's tiny) sharded with fsdpx::fully_shard and trained with SGD (--mlp: AdamW) as plugins,
// or with torch::optim over module->parameters() (--torch-optim); --plain trains the same model on
// the whole global batch in one plain LibTorch loop. Rank 0 prints each step's loss (rank 0's part
// of the batch) and the mean over the ranks (the global batch's).
//   library_worker [--seed-by-rank] [--reshard UNIT=true|false|K ...] [--rank0-reshard UNIT=K]
//                  [--sharding NAME [--sharding-option K=V ...]] [--mlp | --gpt]
//                  [--torch-optim sgd|adamw|rmsprop] [--loss-backward] [--plain] [--accum N [--no-sync]]
//                  [--clip NORM] [--steps N] [--save DIR [--save-after N] [--async]] [--load DIR]
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

#include "fsdpx/fully_shard.h"
#include "fsdpx/error.h"
#include "fsdpx/model.h"
#include "fsdpx/seeds.h"
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

// This rank's part of step `step`'s global batch of 8 samples (plain: all of it), micro-batch `m`
// of `accum`, and the loss on it: the same samples at every world size.
struct Data {
  std::string kind;  // net, mlp or gpt
  int rank = 0, world = 1, accum = 1;
  bool same_batch = false;  // step 0's batch at every step: the loss then falls when training works
  c10::Device device = c10::kCPU;
  at::Tensor loss(int step, int m, Net& net, Mlp& mlp, fsdpx::Model* gpt) const {
    auto g = at::make_generator<at::CPUGeneratorImpl>(100 + (same_batch ? 0 : step));
    const int64_t n = 8 / world / accum, at = rank * (8 / world) + m * n;
    if (kind == "gpt") {
      const at::Tensor t = at::randint(256, {8, 17}, g).narrow(0, at, n).to(device);
      fsdpx::Batch b;
      b.inputs = t.narrow(1, 0, 16);
      b.targets = t.narrow(1, 1, 16);
      b.samples = n;
      b.tokens = n * 16;
      return gpt->loss(b);
    }
    const at::Tensor x = at::randn({8, kind == "mlp" ? 30 : 16}, g), y = (x.sum(1) > 0).to(at::kLong);
    const at::Tensor mine = x.narrow(0, at, n).to(device), labels = y.narrow(0, at, n).to(device);
    if (kind == "mlp") return torch::cross_entropy_loss(mlp->forward(mine), labels);
    return net->forward(mine).sin().pow(2).mean();
  }
};

// gpt tiny's parameters whole, from (seed 0, name) as the engine draws each one: the plain loop's.
void materialise(fsdpx::Model& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.module()->named_parameters()) {
    at::Tensor full = at::empty(p.value().sizes(), at::kFloat);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(fsdpx::parameter_seed(0, p.key()));
    model.init_parameter(p.key(), full, gen);
    p.value().set_data(full);
  }
}

// A writable summon_full_params writes all or nothing: rank 0 prints the sum of every weight
// before, after a scope that zeroed block0.up.weight and threw, after a commit refused for a
// tensor replaced by one of another shape, and after a commit of the zeroed weight; and that
// weight's sum, and the refusal.
void summon_checks(fsdpx::ShardedModule& fsdp, int rank) {
  auto sum_all = [&] {
    double sum = 0;
    for (const auto& [name, t] : fsdp.summon_full_params().all()) sum += t.sum().item<double>();
    return sum;
  };
  const double before = sum_all(), up = fsdp.summon_full_params()["block0.up.weight"].sum().item<double>();
  try {
    auto full = fsdp.summon_full_params(/*writable=*/true);
    full["block0.up.weight"].zero_();
    throw std::runtime_error("a failure while the parameters are summoned");
  } catch (const std::runtime_error&) {
  }
  const double after_throw = sum_all();
  std::string refused;
  try {
    auto full = fsdp.summon_full_params(/*writable=*/true);
    full["block0.up.weight"].zero_();
    full["block0.up.bias"] = at::zeros({3});
    full.commit();
  } catch (const fsdpx::Error& e) {
    refused = e.what();
  }
  const double after_refused = sum_all();
  {
    auto full = fsdp.summon_full_params(/*writable=*/true);
    full["block0.up.weight"].zero_();
    full.commit();
  }
  const double after_commit = sum_all();
  if (rank == 0)
    std::printf("summon: before %.9g after-throw %.9g after-refused %.9g after-commit %.9g up %.9g\nrefused: %s\n",
                before, after_throw, after_refused, after_commit, up, refused.c_str());
}

std::unique_ptr<torch::optim::Optimizer> torch_optimizer(const std::string& name, std::vector<at::Tensor> params) {
  if (name == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  if (name == "adamw") return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01));
  if (name == "rmsprop") return std::make_unique<torch::optim::RMSprop>(params, torch::optim::RMSpropOptions(0.01));
  throw std::invalid_argument("--torch-optim takes sgd, adamw or rmsprop, got " + name);
}

// The options of fully_shard from the command line.
fsdpx::ShardOptions shard_options(const fsdpx::tool::po::variables_map& vm, const std::string& kind) {
  fsdpx::ShardOptions o;
  o.sharding = vm["sharding"].as<std::string>();
  for (const std::string& kv : vm["sharding-option"].as<std::vector<std::string>>())
    o.sharding_options[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  o.wrap_layer_types(kind == "mlp" ? "Hidden" : "Block");
  if (vm.count("recompute")) o.wrap_options["activation_checkpointing"] = "true";
  if (vm.count("offload"))
    for (const char* unit : {"block0", "block1", "block2"}) o.with_activation_offload(unit);
  const char* rank_env = std::getenv("RANK");
  std::vector<std::string> reshard = vm["reshard"].as<std::vector<std::string>>();
  if (vm.count("rank0-reshard") && rank_env && std::atoi(rank_env) == 0)
    reshard.push_back(vm["rank0-reshard"].as<std::string>());
  for (const std::string& kv : reshard) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("--reshard takes UNIT=true|false|K, got " + kv);
    const std::string v = kv.substr(eq + 1);
    if (v == "true" || v == "false") o.with_reshard_after_forward(kv.substr(0, eq), v == "true");
    else o.with_reshard_after_forward(kv.substr(0, eq), std::stoi(v));
  }
  return o;
}

// The model under training and what steps it: fsdpx's sharded module (none: the plain loop), and
// a torch::optim optimizer or a plugin.
struct Training {
  Net net{nullptr};
  Mlp mlp{nullptr};
  std::shared_ptr<fsdpx::Model> gpt;
  std::shared_ptr<torch::nn::Module> module;
  std::unique_ptr<fsdpx::ShardedModule> fsdp;
  std::unique_ptr<torch::optim::Optimizer> torch_opt;
  std::shared_ptr<fsdpx::Optimizer> plugin_opt;

  // One step of `data.accum` micro-batches; the step's loss on this rank's part of the batch.
  double step(const fsdpx::tool::po::variables_map& vm, const Data& data, int step, int rank) {
    double step_loss = 0;
    for (int m = 0; m < data.accum; ++m) {
      if (fsdp && vm.count("no-sync")) fsdp->set_requires_gradient_sync(m + 1 == data.accum);
      auto loss_of = [&] { return data.loss(step, m, net, mlp, gpt.get()) / data.accum; };
      at::Tensor loss = fsdp ? fsdp->forward(loss_of) : loss_of();
      if (fsdp && m == 0 && rank == 0) {
        const fsdpx::MemoryReport held = fsdp->memory();
        std::printf("step %d after forward: gathered %lld B, kept %lld B\n", step, (long long)held.unsharded_bytes,
                    (long long)held.post_forward_bytes);
      }
      if (!fsdp || vm.count("loss-backward")) loss.backward();
      else fsdp->backward(loss);
      step_loss += loss.item<double>();
    }
    if (const double clip = vm["clip"].as<double>(); clip > 0) {
      if (fsdp) fsdp->clip_grad_norm(clip);
      else torch::nn::utils::clip_grad_norm_(module->parameters(), clip);
    }
    if (torch_opt) {
      torch_opt->step();
      torch_opt->zero_grad();
    } else {
      plugin_opt->step(plugin_opt->base_lr());
      fsdp->zero_grad();
    }
    return step_loss;
  }
};

int run(const fsdpx::tool::po::variables_map& vm) {
  const char* rank_env = std::getenv("RANK");
  torch::manual_seed(vm.count("seed-by-rank") && rank_env ? std::atoi(rank_env) : 0);
  const bool plain = vm.count("plain") > 0;
  Data data;
  data.kind = vm.count("gpt") ? "gpt" : vm.count("mlp") ? "mlp" : "net";
  data.accum = vm["accum"].as<int>();
  data.same_batch = vm.count("same-batch") > 0;
  Training t;
  if (data.kind == "mlp") t.module = (t.mlp = Mlp()).ptr();
  else t.module = (t.net = Net()).ptr();
  if (t.net) t.net->touch_inputs = vm.count("touch-inputs") > 0;
  fsdpx::RuntimeSettings settings;
  settings.device = plain ? "cpu" : vm["device"].as<std::string>();
  fsdpx::Runtime rt(settings);
  if (data.kind == "gpt") {
    t.gpt = rt.create_model("gpt", {{"size", "tiny"}, {"seq", "16"}});
    t.module = t.gpt->module();
    if (plain) materialise(*t.gpt);
  }
  const fsdpx::ShardOptions o = shard_options(vm, data.kind);
  if (!plain) t.fsdp = t.gpt ? fsdpx::fully_shard(rt, t.gpt, o) : fsdpx::fully_shard(rt, t.module, o);
  data.rank = plain ? 0 : rt.rank();
  data.world = plain ? 1 : rt.world_size();
  data.device = plain ? c10::Device(c10::kCPU) : rt.device();
  // A torch::optim optimizer over the module's parameters (with fsdpx: this rank's shards), or a plugin.
  const std::string torch_optim = vm["torch-optim"].as<std::string>();
  if (!torch_optim.empty()) t.torch_opt = torch_optimizer(torch_optim, t.module->parameters());
  else if (plain) throw std::invalid_argument("--plain trains with --torch-optim");
  else if (data.kind == "mlp") t.plugin_opt = t.fsdp->optimizer("adamw", {{"lr", "0.01"}});
  else t.plugin_opt = t.fsdp->optimizer("sgd", {{"lr", "0.1"}});
  int first = 0;
  if (vm.count("load")) {
    const std::string dir = vm["load"].as<std::string>();
    first = static_cast<int>(t.torch_opt ? t.fsdp->load(dir, *t.torch_opt) : t.fsdp->load(dir, *t.plugin_opt));
  }
  for (int step = first; step < vm["steps"].as<int>(); ++step) {
    const double step_loss = t.step(vm, data, step, rt.rank());
    const double mean = plain ? step_loss : rt.mean_over_ranks(step_loss);
    if (plain || rt.rank() == 0)
      std::printf("step %d loss %.9g\nstep %d mean loss %.9g\n", step, step_loss, step, mean);
    if (vm.count("save") && step + 1 == vm["save-after"].as<int>()) {
      const std::string dir = vm["save"].as<std::string>();
      const std::map<std::string, std::string> backend = {{"async", vm.count("async") ? "true" : "false"}};
      if (t.torch_opt) t.fsdp->save(dir, *t.torch_opt, step + 1, "sharded", backend);
      else t.fsdp->save(dir, *t.plugin_opt, step + 1, "sharded", backend);
    }
  }
  if (t.fsdp) t.fsdp->wait_for_save();
  if (vm.count("summon-checks")) summon_checks(*t.fsdp, rt.rank());
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
      ("touch-inputs", "the model changes each block's input in place after the block ran (refused with --offload)")
      ("gpt", "the gpt model plugin (tiny, 16 tokens), sharded through the Model overload")
      ("sharding-option", po::value<std::vector<std::string>>()->default_value({}, ""), "KEY=VALUE of --sharding's")
      ("torch-optim", po::value<std::string>()->default_value(""),
       "sgd (lr 0.1, momentum 0.9), adamw or rmsprop (lr 0.01): torch::optim over module->parameters()")
      ("loss-backward", "loss.backward() instead of ShardedModule::backward")
      ("plain", "the plain LibTorch loop in one process, no fsdpx (with --torch-optim)")
      ("accum", po::value<int>()->default_value(1), "micro-batches per step (8 samples in all)")
      ("no-sync", "micro-batches but the last without gradient sync (set_requires_gradient_sync)")
      ("clip", po::value<double>()->default_value(0.0), "clip the gradients' global norm to this (0: no)")
      ("steps", po::value<int>()->default_value(3), "steps")
      ("same-batch", "step 0's global batch at every step")
      ("load", po::value<std::string>(), "start from this checkpoint (ShardedModule::load), at its step")
      ("summon-checks", "after training, writes through summon_full_params that must write all or nothing");
  fsdpx::tool::main(argc, argv, "library_worker", desc, run);
}
