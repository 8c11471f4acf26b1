// A worker for the Hugging Face interop tests: a model (--model, gpt unless named; t5, vit)
// configured from a Hugging Face directory (--model.from_hf) or by its options (--option KEY=VALUE,
// repeated; then --init-from gives the weights), sharded with full_shard over the ranks (its
// first layer type a unit: gpt's Block, t5's T5Block, vit's Block), its weights read the way
// the trainer reads them (load_hf_weights, each rank its own rows; or --init-from, an fsdpx
// checkpoint or consolidated file), then one forward through the sharding engine on the inputs
// of --ids (a safetensors file with a tensor "ids": token ids, or vit's pixel values);
// rank 0 writes the fp32 logits to --out as tensor "logits".
//
//   hf_worker [--nproc-per-node N] [--model gpt|t5|vit] (--from-hf DIR | --option K=V ...)
//             --ids IDS.safetensors --out LOGITS.safetensors [--init-from PATH]
#include <cstdio>
#include <map>
#include <vector>

#include <torch/csrc/autograd/grad_mode.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "fsdpx/framework/engine/sharding_engine.h"
#include "fsdpx/framework/trainer/checkpoint_state.h"
#include "fsdpx/interfaces.h"
#include "tool.h"

using namespace fsdpx;
namespace po = boost::program_options;

namespace {

int run(const po::variables_map& vm) {
  auto groups = tool::join_world();
  auto host = tool::default_plugins();
  const std::string dir = vm.count("from-hf") ? vm["from-hf"].as<std::string>() : "";
  const std::string name = vm["model"].as<std::string>();
  std::map<std::string, std::string> options;
  if (!dir.empty()) options["from_hf"] = dir;
  if (vm.count("option"))
    for (const std::string& kv : vm["option"].as<std::vector<std::string>>()) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) throw Error("--option " + kv + " is not KEY=VALUE");
      options[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  if (dir.empty() && !vm.count("init-from")) throw Error("without --from-hf, give the weights with --init-from");
  std::shared_ptr<Model> model = host->create<Model>(name, options);
  auto* hf = dynamic_cast<HuggingFaceModel*>(model.get());
  if (!hf) throw Error("the " + name + " plugin does not offer fsdpx/hf_interop.h");
  EngineOptions eo;
  eo.layout = host->create<ShardingStrategy>("full_shard")->layout(groups->topology());
  eo.precision = host->create<PrecisionPolicy>("fp32")->spec("");
  EngineComms comms;
  comms.world = groups->world();
  if (eo.layout.shard_group_size > 1) comms.shard = groups->world();
  auto policy = host->create<WrapPolicy>("layer_type", {{"layer_types", model->layer_types().at(0)}});
  ShardingEngine engine(model, policy->select(*model->module()), comms, eo);

  CheckpointState st = weights_state(engine);
  const CheckpointContext ctx = checkpoint_context(*groups, engine);
  if (vm.count("init-from")) {
    load_initial_weights(vm["init-from"].as<std::string>(), st, ctx);
  } else {
    load_hf_weights(dir, st, ctx, [hf](const std::string& n) { return hf->hf_name(n); },
                    [hf](const std::string& n) { return hf->hf_ignorable(n); });
  }
  SafetensorsReader ids_file(vm["ids"].as<std::string>());
  const at::Tensor ids = ids_file.read("ids");
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = engine.forward([&] { return hf->hf_logits(ids); }).contiguous();
  }
  if (groups->topology().rank == 0) {
    SafetensorsWriter w(vm["out"].as<std::string>(), {{"logits", at::kFloat, logits.sizes().vec()}}, {});
    w.write(logits);
    w.close();
    std::printf("logits %s written by rank 0 of %d\n", c10::str(logits.sizes()).c_str(), groups->topology().world_size);
  }
  groups->world()->barrier().wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc;
  desc.add_options()("from-hf", po::value<std::string>(), "")
      ("option", po::value<std::vector<std::string>>()->composing(), "")
      ("model", po::value<std::string>()->default_value("gpt"), "")
      ("ids", po::value<std::string>()->required(), "")
      ("out", po::value<std::string>()->required(), "")
      ("init-from", po::value<std::string>(), "");
  tool::main(argc, argv, "hf_worker", desc, run);
}
