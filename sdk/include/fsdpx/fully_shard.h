// fsdpx as a library: FSDP for any torch::nn::Module in your own LibTorch training loop, with the
// same plugins (sharding strategy, wrap policy, precision policy, optimizer) chosen by name at run
// time, and the same engine fsdpx-train runs (ShardingEngine). docs/library.md has the example.
//
//   fsdpx::Runtime rt;                                   // torchrun's, Slurm's or one process
//   auto model = std::make_shared<Net>();                // layers declared with FSDPX_MODULE
//   auto fsdp = fsdpx::fully_shard(rt, model, fsdpx::ShardOptions().wrap_layer_types("Block"));
//   torch::optim::AdamW opt(model->parameters(), 1e-3);  // the parameters are this rank's shards
//   for (...) {
//     at::Tensor loss = fsdp->forward([&] { return loss_of(model->forward(x), y); });
//     loss.backward();                                   // gradients reduced into the shards' .grad
//     opt.step();
//     opt.zero_grad();
//   }
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/export.h"
#include "fsdpx/memory_report.h"
#include "fsdpx/model.h"
#include "fsdpx/optimizer.h"
#include "fsdpx/reshard_after_forward.h"
#include "fsdpx/topology.h"

namespace torch::optim {
class Optimizer;
}

namespace fsdpx {

class PluginHost;      // fsdpx's plugin host (internal: fsdpx/framework/plugin_host/plugin_host.h)

struct RuntimeSettings {
  std::string device = "cpu";  // "cpu", "cuda" (a GPU per local rank) or "sim"
  std::chrono::milliseconds rendezvous_timeout{60000};
  std::chrono::milliseconds collective_timeout{300000};
  // Plugin folders besides <prefix>/lib/fsdpx/plugins and FSDPX_PLUGIN_PATH's.
  std::vector<std::filesystem::path> plugin_dirs;
  // More ranks on a node than GPUs, over NCCL: each rank a node of its own to NCCL, over loopback
  // sockets (fsdpx-train's --share-gpus; FSDPX_SHARE_GPUS=1 also sets it). For tests and checks.
  bool share_gpus = false;
};

struct ShardOptions;
class ShardedModule;
class Runtime;
// Declared here to be the Runtime's friends; documented where the defaults are given, below.
FSDPX_API std::unique_ptr<ShardedModule> fully_shard(Runtime& runtime, std::shared_ptr<Model> model,
                                                     const ShardOptions& options);
FSDPX_API std::unique_ptr<ShardedModule> fully_shard(Runtime& runtime, std::shared_ptr<torch::nn::Module> module,
                                                     const ShardOptions& options);

// This process among the training processes: its topology (torchrun's RANK, WORLD_SIZE, ...,
// Slurm's SLURM_PROCID, ..., or one process, as fsdpx-train reads them), its device, the process
// groups (the rendezvous happens here: every rank of the job must construct one), the plugins, and
// LibTorch's intra-op threads: this rank's share of the cores (OMP_NUM_THREADS wins), as fsdpx-train.
class FSDPX_API Runtime {
 public:
  explicit Runtime(RuntimeSettings settings = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Topology& topology() const;
  int rank() const { return topology().rank; }
  int world_size() const { return topology().world_size; }
  c10::Device device() const;
  // A model plugin by name with its options as strings (fsdpx-plugins show NAME), e.g.
  // create_model("gpt", {{"size", "1b"}}): its parameters deferred, for fully_shard's Model overload.
  std::shared_ptr<Model> create_model(const std::string& name, const std::map<std::string, std::string>& options = {});
  PluginHost& plugins() const;  // fsdpx's internals: create<T>(name, options) for any component
  // The mean of `value` over every rank, the same on each (summed in rank order): a loss for
  // logging, as FSDP2's users all-reduce it with op AVG (the ranks' losses over equal parts of
  // the global batch average to the global batch's). Collective.
  double mean_over_ranks(double value) const;


 private:
  struct Impl;
  friend class ShardedModule;
  friend std::unique_ptr<ShardedModule> fully_shard(Runtime&, std::shared_ptr<Model>, const ShardOptions&);
  friend std::unique_ptr<ShardedModule> fully_shard(Runtime&, std::shared_ptr<torch::nn::Module>, const ShardOptions&);
  std::unique_ptr<Impl> impl_;
};

// The plugins a module is sharded with, and their options as strings (as fsdpx-train's
// --<section>.<option> takes them; fsdpx-plugins show NAME lists each one's). Set fields by name
// or through the chainable setters; it is not an aggregate, so a field added later cannot shift
// what a brace list meant:
//   fsdpx::ShardOptions().with_sharding("hybrid_shard", {{"shard_size", "8"}}).wrap_layer_types("Block")
struct FSDPX_API ShardOptions {
  ShardOptions();

  std::string sharding = "full_shard";
  std::map<std::string, std::string> sharding_options;
  std::string wrap = "layer_type";  // units by layer type (FSDPX_MODULE's name), path or size
  std::map<std::string, std::string> wrap_options;
  std::string precision = "fp32";
  std::map<std::string, std::string> precision_options;
  bool overlap = true;  // gather the next units while the current one computes
  int prefetch = 1;     // units gathered ahead, forward and backward, when overlapping (EngineOptions::prefetch)
  // Units (by path, e.g. "blocks.3") whose reshard_after_forward differs from the sharding
  // plugin's (full_shard: true, shard_grad_op: false), as FSDP2's fully_shard(reshard_after_forward=)
  // per call: false keeps the unit gathered from its forward to its backward (one all-gather
  // fewer, its full parameters held meanwhile); an int k dividing the shard group's size keeps
  // 1/k of them per rank and all-gathers them for backward within runs of k consecutive ranks
  // (a node, say): {{"blocks.3", false}, {"blocks.4", 8}} (ReshardAfterForward). A path that is
  // no unit, the root (""), or a k that does not divide the shard group's size is refused.
  std::map<std::string, ReshardAfterForward> reshard_after_forward;
  // Units (by path) whose inputs go to host memory during forward and come back one unit ahead of
  // their backward (EngineOptions::activation_offload_units): each must recompute (the layer_type
  // wrap's {"activation_checkpointing", "true"}); a path that is no unit is refused. On a device
  // only: on the CPU nothing moves.
  std::set<std::string> activation_offload;
  // A Model's deferred parameters are initialised from (seed, name), as fsdpx-train's --seed
  // (the overload taking a Model); a module's own values are its own.
  uint64_t seed = 0;

  ShardOptions& with_sharding(std::string name, std::map<std::string, std::string> options = {});
  ShardOptions& with_wrap(std::string name, std::map<std::string, std::string> options = {});
  // The layer_type wrap over these FSDPX_MODULE names (comma-separated): one unit per such layer.
  ShardOptions& wrap_layer_types(const std::string& types);
  ShardOptions& with_precision(std::string name, std::map<std::string, std::string> options = {});
  ShardOptions& with_overlap(bool on);
  ShardOptions& with_prefetch(int units);
  ShardOptions& with_reshard_after_forward(const std::string& unit, ReshardAfterForward choice);
  ShardOptions& with_activation_offload(const std::string& unit);
  ShardOptions& with_seed(uint64_t value);
};

// The whole parameters of a sharded module, by name, on the CPU (ShardedModule::summon_full_params):
// read them (evaluation, export), or, when writable, change them in place and write them back into
// each rank's rows of every parameter (no collective then): with commit(), or when this object
// goes. The write-back checks every tensor's shape first, so it writes all or nothing; when the
// object goes while an exception unwinds, nothing is written.
class FSDPX_API FullParameters {
 public:
  FullParameters(std::map<std::string, at::Tensor> full, std::vector<TensorShard> rows, bool writable);
  ~FullParameters();
  FullParameters(FullParameters&&) noexcept;
  at::Tensor& operator[](const std::string& name);  // throws fsdpx::Error naming the parameters for another name
  std::map<std::string, at::Tensor> all() const { return full_; }  // by value: safe on a temporary
  // Writes the values into this rank's rows now (and not again when the object goes); throws
  // fsdpx::Error, writing nothing, for a tensor whose shape is no longer its parameter's, or when
  // not writable.
  void commit();

 private:
  std::map<std::string, at::Tensor> full_;
  std::vector<TensorShard> rows_;  // this rank's rows of each parameter (views of its shards)
  bool writable_;
  bool pending_;             // written back when the object goes (writable, not yet committed)
  int exceptions_at_start_;  // std::uncaught_exceptions() at construction: more when it goes = unwinding
};

// A module sharded in place: each rank keeps its rows of every parameter, unit by unit.
//
// Between steps the module's parameters are this rank's shards, as FSDP2's are DTensor shards:
// module->parameters() and named_parameters() are the same tensors as before, now of this rank's
// rows (dim 0; the last ranks may hold fewer, or none), and after a backward their .grad is this
// rank's rows of the reduced gradient, averaged over the data-parallel ranks (FSDP2's default):
// any optimizer over them, torch::optim's or the user's own, steps what the engine gathers next.
// With cpu_offload they are in host memory, and so is the optimizer's step. Inside forward's
// function and its backward each unit's parameters are whole, in the compute dtype, while the unit
// runs (FSDP2's unsharded parameters), and a sharded unit's have no storage otherwise.
class FSDPX_API ShardedModule {
 public:
  ~ShardedModule();
  // Runs `forward` (the module's forward and the loss) with every unit's gathering around it:
  // the root's parameters are gathered for the whole function, each unit's by its FSDPX_MODULE
  // holder (`block(x)`; calling block->forward(x) is refused in one line).
  at::Tensor forward(const std::function<at::Tensor()>& forward);
  // loss.backward() does the same: the engine's end of backward runs through autograd, as FSDP2
  // queues its final callback. This adds that it refuses a second synchronised backward after the
  // optimizer stepped inside backward, and that a loss which reached no unit still ends the step.
  void backward(const at::Tensor& loss);
  // Off: backward accumulates locally (micro-batches); the next synchronised backward reduces.
  void set_requires_gradient_sync(bool sync);
  // Clips the sharded gradients (the parameters' .grad) to a global L2 norm of max_norm over every
  // rank; returns the norm before. Collective: torch::nn::utils::clip_grad_norm_ over
  // module->parameters() would see this rank's rows only.
  double clip_grad_norm(double max_norm);
  // An optimizer plugin by name over this rank's shards (its init done); step(lr) updates them.
  // The fastest path (fused over a unit's flat shard); torch::optim's over module->parameters()
  // works too.
  std::shared_ptr<Optimizer> optimizer(const std::string& name, const std::map<std::string, std::string>& options = {});
  // torch::optim's zero_grad: with set_to_none (the default, as FSDP2's) the gradient shards go
  // and the next backward writes them; else they are zeroed in place and it adds to them. An
  // optimizer's own zero_grad over module->parameters() does the same.
  void zero_grad(bool set_to_none = true);
  MemoryReport memory() const;
  std::vector<ParamShard> shards() const;
  // Every parameter whole, on every rank (FSDP's summon_full_params; a copy on the CPU). Collective.
  FullParameters summon_full_params(bool writable = false);
  // The parameters and `optimizer`'s state under `dir` through a checkpoint plugin with its
  // options (sharded: reshardable, loads at any world size and strategy). Collective. With
  // {{"async", "true"}} (sharded) it returns once this step's state is staged into the plugin's
  // pool (pool_mib), and a writer thread per rank writes while training goes on: the checkpoint
  // is complete (renamed into place) once every rank's writer has finished. One save is in flight
  // at most: a save waits for the one before. Else it returns once the checkpoint is complete.
  void save(const std::string& dir, const Optimizer& optimizer, int64_t step = 0,
            const std::string& backend = "sharded", const std::map<std::string, std::string>& backend_options = {});
  // Whether an asynchronous save is still being written; wait_for_save() waits for it. Both
  // throw fsdpx::Error with the failure of a save that failed (one line naming the checkpoint).
  // The module's destruction waits too (a failure then goes to stderr).
  bool save_in_flight();
  void wait_for_save();
  // Loads what save() wrote (at any world size) into the shards and `optimizer`; returns its step.
  // It also reads a folder PyTorch's DCP wrote as safetensors (docs/checkpoints.md): its step is
  // then its optimizer's (0 without one), as DCP records none.
  int64_t load(const std::string& dir, Optimizer& optimizer, const std::string& backend = "sharded");
  // The same with a torch::optim optimizer over module->parameters(): SGD, Adam or AdamW (another
  // is refused in one line), whose state goes under the keys of the sgd and adamw plugins', so a
  // checkpoint moves between torch::optim's and the plugin's optimizer of the same algorithm.
  void save(const std::string& dir, torch::optim::Optimizer& optimizer, int64_t step = 0,
            const std::string& backend = "sharded", const std::map<std::string, std::string>& backend_options = {});
  int64_t load(const std::string& dir, torch::optim::Optimizer& optimizer, const std::string& backend = "sharded");

 private:
  struct Impl;
  friend std::unique_ptr<ShardedModule> fully_shard(Runtime&, std::shared_ptr<Model>, const ShardOptions&);
  explicit ShardedModule(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Shards `module` over `runtime`'s ranks: the wrap plugin picks the units among its layers
// declared with FSDPX_MODULE (fsdpx/unit.h; the root is always one), the sharding plugin the
// layout, the precision plugin the dtypes. The module's parameters may be materialised (each rank
// keeps its rows and frees the rest, unit by unit) and must then be equal on every rank (the same
// seed); a model too large for one rank's memory uses the SDK's deferred parameters
// (fsdpx::deferred_tensor) through a Model and the overload below instead. Collective. Throws
// fsdpx::Error naming what is wrong: an unknown plugin or option, a parameter shared between
// units, a deferred parameter, ranks whose modules differ (in structure or in values).
FSDPX_API std::unique_ptr<ShardedModule> fully_shard(Runtime& runtime, std::shared_ptr<torch::nn::Module> module,
                                                     const ShardOptions& options = {});

// Shards a Model (fsdpx/model.h, as a model plugin defines it) in the caller's loop: its
// parameters are deferred (fsdpx::deferred_tensor) and each rank initialises only its rows, unit
// by unit, from init_parameter(seed, name), so no rank ever holds the whole model: the way for
// models too large for one rank's memory. runtime.create_model("gpt", {{"size", "1b"}}) gives a
// plugin's, whose loss(batch) the caller's forward may call. The same weights as
// fsdpx-train's with the same --seed. Collective.
FSDPX_API std::unique_ptr<ShardedModule> fully_shard(Runtime& runtime, std::shared_ptr<Model> model,
                                                     const ShardOptions& options = {});

}  // namespace fsdpx
