// A worker for the Hugging Face interop tests: a model (--model, gpt unless named; t5) configured
// from a Hugging Face directory (--model.from_hf), sharded with full_shard over the ranks (its
// first layer type a unit: gpt's Block, t5's T5Block), its weights read the way
// the trainer reads them (load_hf_weights, each rank its own rows; or --init-from, an fsdpx
// checkpoint or consolidated file), then one forward through the sharding engine on the token ids
// of --ids (a safetensors file with an int64 tensor "ids", as the model's hf_logits takes them);
// rank 0 writes the fp32 logits to --out as tensor "logits".
//
//   hf_worker [--nproc-per-node N] [--model gpt|t5] --from-hf DIR --ids IDS.safetensors
//             --out LOGITS.safetensors [--init-from PATH]
#include <cstdio>

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
  const std::string dir = vm["from-hf"].as<std::string>();
  const std::string name = vm["model"].as<std::string>();
  std::shared_ptr<Model> model = host->create<Model>(name, {{"from_hf", dir}});
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
  desc.add_options()("from-hf", po::value<std::string>()->required(), "")
      ("model", po::value<std::string>()->default_value("gpt"), "")
      ("ids", po::value<std::string>()->required(), "")
      ("out", po::value<std::string>()->required(), "")
      ("init-from", po::value<std::string>(), "");
  tool::main(argc, argv, "hf_worker", desc, run);
}
