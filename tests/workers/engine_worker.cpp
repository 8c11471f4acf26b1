// A worker for the sharding-engine tests: trains the gpt plugin for a few SGD steps with a
// given strategy and wrap policy, on synthetic token batches whose global batch of step s is the
// same at every world size, and writes what the tests compare.
//
//   engine_worker [--nproc-per-node N] --strategy full_shard --wrap layer_type --out PREFIX
//                 [--steps 4] [--global-batch 12] [--accum 1] [--clip 0] [--overlap 1]
//                 [--sync-every-micro-batch]  (each micro-batch's backward reduces, adding to the last)
//                 [--reference]      (one process, plain LibTorch, no engine)
//                 [--device sim|cuda] [--backend gloo] [--offload]   (the engine on that device; Gloo
//                 staged through host memory, e.g. ranks sharing a GPU; shards in host memory)
//
// PREFIX.losses  (rank 0): one line per step, the mean loss over the global batch
// PREFIX.params  (rank 0): every parameter whole, "name numel rows" then numel float32 values
// PREFIX.rankR   (each rank): "memory <param_bytes> <grad_bytes>", "comm <sent bytes per step>"
//                (counted by the wrapper), "wire <bytes per step>" (sent on this process's TCP
//                sockets, from the kernel) and "expect_comm <bytes per step from the formula>"
#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/device.h"
#include "fsdpx/framework/runtime/process_groups.h"
#include "fsdpx/framework/base/shard_geometry.h"
#include "fsdpx/activation_memory.h"
#include "fsdpx/framework/engine/memory_plan.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/engine/unit_buffers.h"
#include "fsdpx/framework/runtime/memory_accounting.h"
#include "fsdpx/framework/runtime/topology_resolver.h"
#include "fsdpx/interfaces.h"
#include "tool.h"

using namespace fsdpx;
namespace po = boost::program_options;

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
    at::Tensor c = t.to(at::kCPU).contiguous().to(at::kFloat);  // host staging: a device pointer is not the host's
    out << name << " " << c.numel() << " " << (c.dim() ? c.size(0) : 1) << "\n";
    out.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * sizeof(float));
  }
}

std::map<std::string, std::string> key_values(const std::vector<std::string>& items) {
  std::map<std::string, std::string> m;
  for (const auto& i : items) m[i.substr(0, i.find('='))] = i.substr(i.find('=') + 1);
  return m;
}

std::vector<std::string> list(const po::variables_map& vm, const char* key) {
  return vm[key].as<std::vector<std::string>>();
}

// What every run of the worker shares.
struct Run {
  const po::variables_map& vm;
  std::shared_ptr<const DeviceRuntime> device;  // where the engine computes
  PluginHost& host;
  std::shared_ptr<Model> model;
  std::string out;
  int steps, accum;
  bool sync_every;  // every micro-batch's backward reduces (FSDP2 adds the reduced gradients)
  int64_t global;
  double lr, clip;
  uint64_t seed;
};

// One process, plain LibTorch: whole parameters from (seed, name), the whole global batch, SGD
// (or the named optimizer on whole tensors).
int run_reference(Run& r) {
  auto root = r.model->module();
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (auto& p : root->named_parameters()) {
    at::Tensor full = at::empty(p.value().sizes(), at::kFloat);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(r.seed, p.key()));
    r.model->init_parameter(p.key(), full, gen);
    p.value().set_data(full);
    params.emplace_back(p.key(), p.value());
  }
  std::ofstream losses(r.out + ".losses");
  std::shared_ptr<Optimizer> ref_opt;
  if (r.vm.count("optimizer")) {
    ref_opt = r.host.create<Optimizer>(r.vm["optimizer"].as<std::string>(), {{"lr", std::to_string(r.lr)}});
    std::vector<ParamShard> whole;
    for (auto& [n, p] : params) whole.push_back({n, p});
    ref_opt->init(whole);
  }
  for (int s = 0; s < r.steps; ++s) {
    at::Tensor tokens = global_tokens(r.seed, s, r.global);
    double step_loss = 0;
    for (int m = 0; m < r.accum; ++m) {
      at::Tensor loss = r.model->loss(slice(tokens, m * r.global / r.accum, r.global / r.accum)) / r.accum;
      loss.backward();
      step_loss += loss.item<double>();
    }
    at::NoGradGuard no_grad;
    if (r.clip > 0) {
      double sq = 0;
      for (auto& [n, p] : params) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
      double scale = r.clip / (std::sqrt(sq) + 1e-6);
      if (scale < 1) for (auto& [n, p] : params) p.mutable_grad().mul_(scale);
    }
    if (ref_opt) ref_opt->step(r.lr);
    for (auto& [n, p] : params) {
      if (!ref_opt) p.sub_(p.grad() * r.lr);
      p.mutable_grad() = at::Tensor();
    }
    char line[64];
    std::snprintf(line, sizeof line, "%.9g\n", step_loss);
    losses << line;
  }
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (auto& [n, p] : params) named.emplace_back(n, p.detach());
  write_params(r.out + ".params", named);
  return 0;
}

// Every parameter whole (name, tensor): each one's shard (its rows of the parameter, padded at the
// end) all-gathered over `shard_group` on `device`, the padding cut. The full shapes are the
// engine's plan's (the module's parameters are this rank's shards between steps). Collective over
// the shard group (none: the shards are whole).
std::vector<std::pair<std::string, at::Tensor>> full_parameters(const ShardingEngine& engine, c10::Device device,
                                                                 Communicator* shard_group) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& u : engine.plan().units)
    for (size_t i = 0; i < u.names.size(); ++i) shapes[u.names[i]] = u.shapes[i];
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const ParamShard& p : engine.shards()) {
    const std::vector<int64_t>& shape = shapes.at(p.name);
    at::Tensor mine = p.param.detach().to(device).contiguous();
    at::Tensor all = mine;
    if (shard_group != nullptr) {
      all = at::empty({shard_group->size() * mine.numel()}, mine.options());
      shard_group->all_gather(all, mine.reshape({-1})).wait();
    }
    const int64_t rows = shape.empty() ? 1 : shape[0];
    at::Tensor grid = all.view({-1, mine.numel() / mine.size(0)});
    out.emplace_back(p.name, grid.narrow(0, 0, rows).reshape(shape).clone());
  }
  return out;
}

// The engine under test and its communicators, counted.
struct Sharded {
  std::shared_ptr<ProcessGroups> groups;
  std::shared_ptr<CountingCommunicator> counted, counted_replicate;
  std::shared_ptr<CountingCommunicator> counted_post_forward;  // --unit-reshard UNIT=K's group of K ranks
  std::unique_ptr<ShardingEngine> engine;
  ShardingLayout layout;
  EngineOptions options;
  // --step-trace: the engine's events while `tracing` (the second step: the first forward has no
  // earlier order to prefetch by).
  std::shared_ptr<std::vector<std::string>> trace = std::make_shared<std::vector<std::string>>();
  std::shared_ptr<bool> tracing = std::make_shared<bool>(false);
  // --step-in-backward: the optimizer's step of a range of shards, set once the optimizer exists.
  std::shared_ptr<std::function<void(size_t, size_t)>> step_shards =
      std::make_shared<std::function<void(size_t, size_t)>>();
};

Sharded build_sharded(Run& r) {
  Sharded sh;
  const c10::DeviceType type = r.device->device().type();
  sh.groups = tool::join_world(std::chrono::seconds(60), std::chrono::seconds(60),
                               type == c10::kCPU    ? DeviceKind::Cpu
                               : type == c10::kCUDA ? DeviceKind::Cuda
                                                    : DeviceKind::Sim,
                               r.vm["backend"].as<std::string>() == "gloo" ? Backend::Gloo : Backend::Default);
  const Topology& topo = sh.groups->topology();
  auto strategy = r.host.create<ShardingStrategy>(r.vm["strategy"].as<std::string>());
  auto policy = r.host.create<WrapPolicy>(r.vm["wrap"].as<std::string>(), key_values(list(r.vm, "wrap-option")));
  EngineOptions eo;
  eo.layout = strategy->layout(topo);
  eo.seed = r.seed;
  eo.overlap = r.vm["overlap"].as<int>() != 0;
  eo.prefetch = r.vm["prefetch"].as<int>();
  int post_forward_k = 0;
  for (const auto& [unit, v] : key_values(list(r.vm, "unit-reshard"))) {
    if (v == "0" || v == "1") {
      eo.reshard_after_forward_by_unit[unit] = v == "1";
    } else {
      eo.reshard_after_forward_by_unit[unit] = post_forward_k = std::stoi(v);
    }
  }
  if (r.vm.count("step-trace"))
    eo.step_trace = [trace = sh.trace, on = sh.tracing](const std::string& e) {
      if (*on) trace->push_back(e);
    };
  if (r.vm.count("step-in-backward"))
    eo.step_in_backward = [step = sh.step_shards](size_t first, size_t count) { (*step)(first, count); };
  const std::shared_ptr<PrecisionPolicy> precision =
      r.host.create<PrecisionPolicy>(r.vm["precision"].as<std::string>(), key_values(list(r.vm, "precision-option")));
  eo.precision = precision->spec("");
  use_precision_policy(eo, precision);  // per unit, and float8's choices
  eo.layout.offload_to_cpu = r.vm.count("offload") > 0;
  eo.device = r.device;
  EngineComms comms;
  comms.world = sh.groups->world();
  comms.control = sh.groups->control();
  if (const int hs = r.vm["hybrid-shard"].as<int>(); hs > 0) {
    eo.layout = ShardingLayout{hs, topo.world_size / hs, eo.layout.reshard_after_forward, eo.layout.offload_to_cpu};
    auto h = sh.groups->hybrid(hs);
    comms.shard = sh.counted = std::make_shared<CountingCommunicator>(h.shard);
    comms.replicate = sh.counted_replicate = std::make_shared<CountingCommunicator>(h.replicate);
  } else {
    if (eo.layout.shard_group_size > 1)
      comms.shard = sh.counted = std::make_shared<CountingCommunicator>(sh.groups->world());
    if (eo.layout.replicate_group_size > 1)
      comms.replicate = sh.counted = std::make_shared<CountingCommunicator>(sh.groups->world());
  }
  if (post_forward_k > 1) {  // the k consecutive ranks holding this one (one k per run here)
    std::vector<int> ranks;
    const int first = topo.rank - topo.rank % post_forward_k;
    for (int q = first; q < first + post_forward_k; ++q) ranks.push_back(q);
    comms.post_forward[post_forward_k] = sh.counted_post_forward =
        std::make_shared<CountingCommunicator>(sh.groups->new_group("post_forward", ranks));
  }
  const std::vector<UnitSelection> units = policy->select(*r.model->module());
  if (r.vm.count("activation-offload"))
    for (const auto& u : units)
      if (u.activation_checkpoint) eo.activation_offload_units.insert(u.fqn);
  sh.layout = eo.layout;
  sh.options = eo;
  sh.engine = std::make_unique<ShardingEngine>(r.model, units, comms, eo);
  return sh;
}

// The strategy's formula: per unit of T shard elements (padded) over S ranks, each all-gather
// and reduce-scatter of S x T x 4 bytes sends (S-1) x T x 4 (the all-gather twice when the unit
// reshards after forward); all-reduce (DDP) 2 x (W-1)/W x T x 4. From the engine's plan and the
// shard geometry, as the run plan computes it (ring_sent_bytes).
int64_t expected_comm(const ShardingEngine& engine, const EngineOptions& options, int world) {
  const ShardingLayout& layout = options.layout;
  int64_t expect = 0;
  const int64_t S = layout.shard_group_size;
  const auto& units = engine.plan().units;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t bytes = S * padded_shard_numel(units[u].shapes, S) * 4;
    const int k = post_forward_group(layout, u == 0, reshard_choice_of(options, units[u].fqn));
    // The backward's all-gather of the same bytes over k ranks (k = S: the shard group; 1: none).
    if (S > 1)
      expect += 2 * ring_sent_bytes(Collective::AllGather, bytes, S) +
                (k > 1 ? ring_sent_bytes(Collective::AllGather, bytes, k) : 0);
    else if (world > 1) expect += ring_sent_bytes(Collective::AllReduce, bytes, world);
  }
  return expect;
}

// --step-trace: the memory plan's replay of this step (predict_step_memory), its events in
// `.plan_trace`, beside the engine's second step in `.engine_trace`.
void write_step_traces(Run& r, const Sharded& sh, int world) {
  const ShardingEngine& engine = *sh.engine;
  StepMemoryInput in;
  in.units = units_for_memory(engine.plan(), sh.layout.shard_group_size,
                              std::vector<PrecisionSpec>(engine.plan().units.size(), sh.options.precision));
  for (UnitMemory& u : in.units) u.reshard_after_forward = reshard_choice_of(sh.options, u.fqn);
  in.layout = sh.layout;
  in.world_size = world;
  in.overlap = sh.options.overlap;
  in.prefetch = sh.options.prefetch;
  in.forwards = r.accum;
  in.clip_grad_norm = r.clip > 0;
  in.step_in_backward = r.vm.count("step-in-backward") > 0;
  in.offload = sh.layout.offloads(r.device->device().is_cpu());
  const auto* stated = dynamic_cast<const ActivationMemory*>(r.model.get());
  if (!stated) throw Error("--step-trace needs a model that states its activations (fsdpx/activation_memory.h)");
  in.layers = stated->activations(r.global / world / r.accum, kSeq, sh.options.precision.compute);
  std::vector<std::string> replayed;
  in.step_trace = [&](const std::string& e) { replayed.push_back(e); };
  const StepMemory planned = predict_step_memory(in);
  std::ofstream(r.out + ".plan_peak") << planned.peak - planned.param_bytes - planned.optimizer_bytes << "\n";
  std::ofstream plan(r.out + ".plan_trace"), eng(r.out + ".engine_trace");
  for (const auto& e : replayed) plan << e << "\n";
  for (const auto& e : *sh.trace) eng << e << "\n";
}

// One training step on this rank's share of the global batch; this rank's loss.
double sharded_step(Run& r, Sharded& sh, Optimizer* opt, int s) {
  ShardingEngine& engine = *sh.engine;
  const int rank = sh.groups->topology().rank, world = sh.groups->topology().world_size;
  const int64_t local = r.global / world / r.accum;
  at::Tensor tokens = global_tokens(r.seed, s, r.global);
  double step_loss = 0;
  for (int m = 0; m < r.accum; ++m) {
    engine.set_requires_gradient_sync(r.sync_every || m == r.accum - 1);
    // Micro-batch m of this rank: the rank's share of the global batch's m-th slice.
    Batch b = slice(tokens, m * (r.global / r.accum) + rank * local, local);
    b.inputs = b.inputs.to(r.device->device());
    b.targets = b.targets.to(r.device->device());
    at::Tensor loss = engine.forward([&] { return r.model->loss(b) / r.accum; });
    engine.backward(loss);
    step_loss += loss.item<double>();
  }
  if (r.clip > 0) engine.clip_grad_norm(r.clip);
  if (opt) {
    if (!r.vm.count("step-in-backward")) opt->step(r.lr);  // else the backward stepped every unit
  } else {
    at::NoGradGuard no_grad;
    for (auto& p : engine.shards()) p.param.sub_(p.param.grad() * r.lr);
  }
  engine.release_gradients();  // the next step's reduction writes the gradient shards afresh
  return step_loss;
}

// The engine at this world size: losses (rank 0), parameters (rank 0), and per rank what was
// measured next to the formulas.
int run_sharded(Run& r) {
  Sharded sh = build_sharded(r);
  ShardingEngine& engine = *sh.engine;
  const int rank = sh.groups->topology().rank, world = sh.groups->topology().world_size;
  std::ofstream mine(r.out + ".rank" + std::to_string(rank));
  auto mem = engine.memory();
  mine << "memory " << mem.param_bytes << " " << mem.grad_bytes << "\n";
  mine << "expect_comm " << expected_comm(engine, sh.options, world) << "\n";
  std::ofstream losses;
  if (rank == 0) {
    losses.open(r.out + ".losses");
    std::ofstream(r.out + ".plan") << engine.plan().table();
  }
  std::shared_ptr<Optimizer> opt;
  if (r.vm.count("optimizer")) {
    auto oo = key_values(list(r.vm, "optimizer-option"));
    oo["lr"] = std::to_string(r.lr);
    opt = r.host.create<Optimizer>(r.vm["optimizer"].as<std::string>(), oo);
    opt->init(engine.shards());
    *sh.step_shards = [opt, lr = r.lr](size_t first, size_t count) { opt->step_shards(lr, first, count); };
  }
  if (r.vm.count("step-in-backward") && !opt) throw Error("--step-in-backward needs --optimizer");
  for (int s = 0; s < r.steps; ++s) {
    const int64_t before = sh.counted ? sh.counted->stats().sent_bytes() : 0;
    const int64_t before_replicate = sh.counted_replicate ? sh.counted_replicate->stats().sent_bytes() : 0;
    const int64_t before_post = sh.counted_post_forward ? sh.counted_post_forward->stats().sent_bytes() : 0;
    sh.groups->control()->barrier().wait();
    const int64_t wire_before = tcp_bytes_sent();
    *sh.tracing = s == 1;
    reset_cpu_peak_memory();
    const int64_t at_start = cpu_memory_stats().allocated;
    const double step_loss = sharded_step(r, sh, opt.get(), s);
    *sh.tracing = false;
    // The step's peak above what it began with (the counting allocator: the CPU's).
    mine << "step_rise " << cpu_memory_stats().peak_allocated - at_start << "\n";
    sh.groups->control()->barrier().wait();
    if (world > 1) mine << "wire " << tcp_bytes_sent() - wire_before << "\n";  // what the kernel sent
    if (sh.counted) mine << "comm " << sh.counted->stats().sent_bytes() - before << "\n";
    if (sh.counted) mine << "allgather_total " << sh.counted->stats()[Collective::AllGather].payload_bytes << "\n";
    if (sh.counted_replicate)
      mine << "comm_replicate " << sh.counted_replicate->stats().sent_bytes() - before_replicate << "\n";
    if (sh.counted_post_forward)
      mine << "comm_post_forward " << sh.counted_post_forward->stats().sent_bytes() - before_post << "\n";
    at::Tensor l = at::full({1}, step_loss, at::kDouble);
    sh.groups->control()->all_reduce(l, ReduceOp::Avg).wait();
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
  mine << "memory_after " << mem.param_bytes << " " << mem.grad_bytes << " "
       << mem.unsharded_bytes + mem.post_forward_bytes << "\n";
  auto full =
      full_parameters(engine, r.device->device(), engine.shard_size() > 1 ? sh.counted.get() : nullptr);
  if (rank == 0) write_params(r.out + ".params", full);
  if (rank == 0 && r.vm.count("step-trace")) write_step_traces(r, sh, world);
  // On sim: the streams that did work and the stream-order hazards seen (fsdpx_sim_stream_report).
  if (r.device->device().type() == c10::DeviceType::PrivateUse1) {
    using Report = const char* (*)();
    if (auto report = reinterpret_cast<Report>(dlsym(RTLD_DEFAULT, "fsdpx_sim_stream_report")))
      std::ofstream(r.out + ".streams." + std::to_string(rank)) << report();
  }
  sh.groups->control()->barrier().wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  install_cpu_memory_accounting();
  po::options_description desc;
  desc.add_options()("strategy", po::value<std::string>()->default_value("full_shard"), "")(
      "wrap", po::value<std::string>()->default_value("layer_type"), "")(
      "wrap-option", po::value<std::vector<std::string>>()->default_value({}, ""), "key=value")(
      "model-option", po::value<std::vector<std::string>>()->default_value({}, ""), "key=value")(
      "steps", po::value<int>()->default_value(4), "")("global-batch", po::value<int64_t>()->default_value(12), "")(
      "accum", po::value<int>()->default_value(1), "")("clip", po::value<double>()->default_value(0.0), "")(
      "lr", po::value<double>()->default_value(0.1), "")("seed", po::value<uint64_t>()->default_value(7), "")(
      "overlap", po::value<int>()->default_value(1), "")("prefetch", po::value<int>()->default_value(1),
                                                         "units gathered ahead when overlapping")(
      "unit-reshard", po::value<std::vector<std::string>>()->default_value({}, ""),
      "UNIT=0|1|K: that unit's reshard_after_forward (EngineOptions::reshard_after_forward_by_unit; K >= 2: a "
      "post-forward group of K consecutive ranks)")(
      "step-trace", "rank 0 writes the engine's events of step 2 and the memory plan's replay of a step")(
      "sync-every-micro-batch", "every micro-batch's backward reduces its gradients (added to the last)")(
      "reference", "")("device", po::value<std::string>()->default_value("cpu"), "cpu, sim or cuda")(
      "backend", po::value<std::string>()->default_value("default"), "gloo: device tensors staged through host memory")(
      "offload", "shards, gradients and optimizer state in host memory (cpu_offload)")(
      "precision", po::value<std::string>()->default_value("fp32"), "a precision plugin")(
      "precision-option", po::value<std::vector<std::string>>()->default_value({}, ""), "key=value")(
      "hybrid-shard", po::value<int>()->default_value(0),
      "shard over groups of this many ranks and replicate across them (the engine's hybrid layout)")(
      "optimizer", po::value<std::string>(), "an optimizer plugin instead of the built-in SGD")(
      "optimizer-option", po::value<std::vector<std::string>>()->default_value({}, ""), "key=value")(
      "step-in-backward", "the optimizer steps each unit inside backward (EngineOptions::step_in_backward)")(
      "activation-offload", "the recomputed units' inputs go to host memory (EngineOptions::activation_offload_units)")(
      "skew-rank1", "rank 1 builds a model with one more layer (a deliberate mismatch)")(
      "out", po::value<std::string>()->required(), "");
  tool::main(argc, argv, "engine_worker", desc, [](const po::variables_map& vm) {
    auto host = tool::default_plugins();
    auto model_options = key_values(list(vm, "model-option"));
    model_options.emplace("seq", std::to_string(kSeq));
    if (vm.count("skew-rank1") && resolve_topology({}, process_environment()).topology.rank == 1)
      model_options["layers"] = "3";
    const std::string device = vm["device"].as<std::string>();
    Run r{vm,
          open_device(device, resolve_topology({}, process_environment()).topology.local_rank),
          *host,
          host->create<Model>("gpt", model_options),
          vm["out"].as<std::string>(),
          vm["steps"].as<int>(),
          vm["accum"].as<int>(),
          vm.count("sync-every-micro-batch") > 0,
          vm["global-batch"].as<int64_t>(),
          vm["lr"].as<double>(),
          vm["clip"].as<double>(),
          vm["seed"].as<uint64_t>()};
    return vm.count("reference") ? run_reference(r) : run_sharded(r);
  });
}
