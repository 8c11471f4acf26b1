// A worker for the sharding-engine tests: trains the gpt plugin for a few SGD steps with a
// given strategy and wrap policy, on synthetic token batches whose global batch of step s is the
// same at every world size, and writes what the tests compare.
//
//   engine_worker [--nproc-per-node N] --strategy full_shard --wrap layer_type --out PREFIX
//                 [--steps 4] [--global-batch 12] [--accum 1] [--clip 0] [--overlap 1]
//                 [--reference]      (one process, plain LibTorch, no engine)
//
// PREFIX.losses  (rank 0): one line per step, the mean loss over the global batch
// PREFIX.params  (rank 0): every parameter whole, "name numel rows" then numel float32 values
// PREFIX.rankR   (each rank): "memory <param_bytes> <grad_bytes>", "comm <sent bytes per step>"
//                (counted by the wrapper), "wire <bytes per step>" (sent on this process's TCP
//                sockets, from the kernel) and "expect_comm <bytes per step from the formula>"
#include <cstdio>
#include <fstream>
#include <map>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/CPUGeneratorImpl.h>
#include <boost/program_options.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/launcher.h"
#include "fsdpx/framework/plugin_host.h"
#include "fsdpx/framework/process_groups.h"
#include "fsdpx/framework/sharding_engine.h"
#include "fsdpx/framework/topology_resolver.h"
#include "fsdpx/interfaces.h"

namespace po = boost::program_options;
using namespace fsdpx;

namespace {

constexpr int64_t kSeq = 16, kVocab = 256;

// The global batch of `step`: `global` sequences of kSeq + 1 tokens, the same at any world size.
at::Tensor global_tokens(uint64_t seed, int step, int64_t global) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(seed, "batch/" + std::to_string(step)));
  return at::randint(kVocab, {global, kSeq + 1}, gen, at::kLong);
}

Batch slice(const at::Tensor& tokens, int64_t first, int64_t count) {
  return next_token_batch(tokens.narrow(0, first, count));
}

void write_params(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& [name, t] : params) {
    at::Tensor c = t.contiguous().to(at::kFloat);
    out << name << " " << c.numel() << " " << (c.dim() ? c.size(0) : 1) << "\n";
    out.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * sizeof(float));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    std::vector<std::string> args;
    if (auto rc = launch_if_requested(argc, argv, "engine_worker", args)) return *rc;
    po::options_description desc;
    desc.add_options()("strategy", po::value<std::string>()->default_value("full_shard"), "")
        ("wrap", po::value<std::string>()->default_value("layer_type"), "")
        ("wrap-option", po::value<std::vector<std::string>>()->default_value({}, ""), "key=value")
        ("model-option", po::value<std::vector<std::string>>()->default_value({}, ""), "key=value")
        ("steps", po::value<int>()->default_value(4), "")
        ("global-batch", po::value<int64_t>()->default_value(12), "")
        ("accum", po::value<int>()->default_value(1), "")
        ("clip", po::value<double>()->default_value(0.0), "")
        ("lr", po::value<double>()->default_value(0.1), "")
        ("seed", po::value<uint64_t>()->default_value(7), "")
        ("overlap", po::value<int>()->default_value(1), "")
        ("reference", "")
        ("precision", po::value<std::string>()->default_value("fp32"), "a precision plugin")
        ("hybrid-shard", po::value<int>()->default_value(0),
         "shard over groups of this many ranks and replicate across them (the engine's hybrid layout)")
        ("optimizer", po::value<std::string>(), "an optimizer plugin instead of the built-in SGD")
        ("optimizer-option", po::value<std::vector<std::string>>()->default_value({}, ""), "key=value")
        ("skew-rank1", "rank 1 builds a model with one more layer (a deliberate mismatch)")
        ("out", po::value<std::string>()->required(), "");
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    po::notify(vm);
    const std::string out = vm["out"].as<std::string>();
    const int steps = vm["steps"].as<int>(), accum = vm["accum"].as<int>();
    const int64_t global = vm["global-batch"].as<int64_t>();
    const double lr = vm["lr"].as<double>(), clip = vm["clip"].as<double>();
    const uint64_t seed = vm["seed"].as<uint64_t>();
    auto kv = [](const std::vector<std::string>& items) {
      std::map<std::string, std::string> m;
      for (const auto& i : items) m[i.substr(0, i.find('='))] = i.substr(i.find('=') + 1);
      return m;
    };

    PluginHost host;
    for (const auto& e : host.discover(PluginSearch{})) throw Error(e);
    auto model_options = kv(vm["model-option"].as<std::vector<std::string>>());
    model_options.emplace("seq", std::to_string(kSeq));
    if (vm.count("skew-rank1") && resolve_topology({}, process_environment()).topology.rank == 1)
      model_options["layers"] = "3";
    auto model = host.create<Model>("gpt", model_options);
    std::ofstream losses;

    if (vm.count("reference")) {
      // Plain LibTorch: whole parameters from (seed, name), the whole global batch, SGD.
      auto root = model->module();
      std::vector<std::pair<std::string, at::Tensor>> params;
      for (auto& p : root->named_parameters()) {
        at::Tensor full = at::empty(p.value().sizes(), at::kFloat);
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(seed, p.key()));
        model->init_parameter(p.key(), full, gen);
        p.value().set_data(full);
        params.emplace_back(p.key(), p.value());
      }
      losses.open(out + ".losses");
      std::shared_ptr<Optimizer> ref_opt;
      if (vm.count("optimizer")) {
        ref_opt = host.create<Optimizer>(vm["optimizer"].as<std::string>(), {{"lr", std::to_string(lr)}});
        std::vector<ParamShard> whole;
        for (auto& [n, p] : params) whole.push_back({n, p});
        ref_opt->init(whole);
      }
      for (int s = 0; s < steps; ++s) {
        at::Tensor tokens = global_tokens(seed, s, global);
        double step_loss = 0;
        for (int m = 0; m < accum; ++m) {
          at::Tensor loss = model->loss(slice(tokens, m * global / accum, global / accum)) / accum;
          loss.backward();
          step_loss += loss.item<double>();
        }
        at::NoGradGuard no_grad;
        if (clip > 0) {
          double sq = 0;
          for (auto& [n, p] : params) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
          double scale = clip / (std::sqrt(sq) + 1e-6);
          if (scale < 1) for (auto& [n, p] : params) p.mutable_grad().mul_(scale);
        }
        if (ref_opt) ref_opt->step(lr);
        for (auto& [n, p] : params) {
          if (!ref_opt) p.sub_(p.grad() * lr);
          p.mutable_grad() = at::Tensor();
        }
        char line[64];
        std::snprintf(line, sizeof line, "%.9g\n", step_loss);
        losses << line;
      }
      std::vector<std::pair<std::string, at::Tensor>> named;
      for (auto& [n, p] : params) named.emplace_back(n, p.detach());
      write_params(out + ".params", named);
      return 0;
    }

    RuntimeOptions ro;
    ro.topology = resolve_topology({}, process_environment()).topology;
    ro.rendezvous_timeout = std::chrono::seconds(60);
    ro.collective_timeout = std::chrono::seconds(60);
    auto groups = ProcessGroups::create(ro);
    auto strategy = host.create<ShardingStrategy>(vm["strategy"].as<std::string>());
    auto policy = host.create<WrapPolicy>(vm["wrap"].as<std::string>(), kv(vm["wrap-option"].as<std::vector<std::string>>()));
    EngineOptions eo;
    eo.layout = strategy->layout(ro.topology);
    eo.seed = seed;
    eo.overlap = vm["overlap"].as<int>() != 0;
    eo.precision = host.create<PrecisionPolicy>(vm["precision"].as<std::string>())->spec("");
    EngineComms comms;
    comms.world = groups->world();
    std::shared_ptr<CountingCommunicator> counted, counted_replicate;
    if (const int hs = vm["hybrid-shard"].as<int>(); hs > 0) {
      eo.layout = ShardingLayout{hs, ro.topology.world_size / hs, eo.layout.reshard_after_forward, false};
      auto h = groups->hybrid(hs);
      comms.shard = counted = std::make_shared<CountingCommunicator>(h.shard);
      comms.replicate = counted_replicate = std::make_shared<CountingCommunicator>(h.replicate);
    } else {
      if (eo.layout.shard_group_size > 1) comms.shard = counted = std::make_shared<CountingCommunicator>(groups->world());
      if (eo.layout.replicate_group_size > 1) comms.replicate = counted = std::make_shared<CountingCommunicator>(groups->world());
    }
    ShardingEngine engine(model, policy->select(*model->module()), comms, eo);

    const int rank = ro.topology.rank, world = ro.topology.world_size;
    std::ofstream mine(out + ".rank" + std::to_string(rank));
    auto mem = engine.memory();
    mine << "memory " << mem.param_bytes << " " << mem.grad_bytes << "\n";
    // The strategy's formula: per unit of T shard elements over S ranks, each all-gather and
    // reduce-scatter sends (S-1) x T x 4 bytes; all-reduce (DDP) 2 x (W-1)/W x T x 4.
    int64_t expect = 0;
    const int64_t S = eo.layout.shard_group_size;
    auto numels = engine.unit_shard_numels();
    auto reshards = engine.unit_reshards_after_forward();
    for (size_t u = 0; u < numels.size(); ++u) {
      if (S > 1) expect += (reshards[u] ? 3 : 2) * (S - 1) * numels[u] * 4;
      else if (world > 1) expect += 2 * (world - 1) * numels[u] * 4 / world;
    }
    mine << "expect_comm " << expect << "\n";
    if (rank == 0) {
      losses.open(out + ".losses");
      std::ofstream(out + ".plan") << engine.plan().table();
    }
    const int64_t local = global / world / accum;
    std::shared_ptr<Optimizer> opt;
    if (vm.count("optimizer")) {
      auto oo = kv(vm["optimizer-option"].as<std::vector<std::string>>());
      oo["lr"] = std::to_string(lr);
      opt = host.create<Optimizer>(vm["optimizer"].as<std::string>(), oo);
      opt->init(engine.shards());
    }
    for (int s = 0; s < steps; ++s) {
      at::Tensor tokens = global_tokens(seed, s, global);
      const int64_t before = counted ? counted->stats().sent_bytes() : 0;
      const int64_t before_replicate = counted_replicate ? counted_replicate->stats().sent_bytes() : 0;
      groups->world()->barrier().wait();
      const int64_t wire_before = tcp_bytes_sent();
      double step_loss = 0;
      for (int m = 0; m < accum; ++m) {
        engine.set_requires_gradient_sync(m == accum - 1);
        // Micro-batch m of this rank: the rank's share of the global batch's m-th slice.
        Batch b = slice(tokens, m * (global / accum) + rank * local, local);
        at::Tensor loss = engine.forward([&] { return model->loss(b) / accum; });
        engine.backward(loss);
        step_loss += loss.item<double>();
      }
      if (clip > 0) engine.clip_grad_norm(clip);
      if (opt) {
        opt->step(lr);
      } else {
        at::NoGradGuard no_grad;
        for (auto& p : engine.shards()) p.param.sub_(p.param.grad() * lr);
      }
      groups->world()->barrier().wait();
      if (world > 1) mine << "wire " << tcp_bytes_sent() - wire_before << "\n";  // what the kernel sent
      if (counted) mine << "comm " << counted->stats().sent_bytes() - before << "\n";
      if (counted) mine << "allgather_total " << counted->stats()[Collective::AllGather].payload_bytes << "\n";
      if (counted_replicate) mine << "comm_replicate " << counted_replicate->stats().sent_bytes() - before_replicate << "\n";
      at::Tensor l = at::full({1}, step_loss, at::kDouble);
      groups->world()->all_reduce(l, ReduceOp::Avg).wait();
      if (rank == 0) {
        char line[64];
        std::snprintf(line, sizeof line, "%.9g\n", l.item<double>());
        losses << line;
      }
    }
    if (opt) {
      int64_t state_bytes = 0;  // per-parameter state (the scalar step counts are not)
      for (auto& p : engine.shards())
        for (const auto& [key, t] : opt->state(p.name))
          if (t.dim() > 0) state_bytes += t.numel() * t.element_size();
      mine << "optimizer_state " << state_bytes << "\n";
    }
    mem = engine.memory();
    mine << "memory_after " << mem.param_bytes << " " << mem.grad_bytes << " " << mem.unsharded_bytes << "\n";
    auto full = engine.full_parameters();
    if (rank == 0) write_params(out + ".params", full);
    groups->world()->barrier().wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_worker: %s\n", e.what());
    return 1;
  }
}
