// Out-of-line destructors (and the defaults of appended virtuals) of the public interfaces, so
// that their type information and vtables live in libfsdpx alone (one definition shared by the
// host and every plugin).
#include "fsdpx/interfaces.h"
#include "fsdpx/activation_memory.h"
#include "fsdpx/error.h"
#include "fsdpx/hf_interop.h"
#include "fsdpx/layer_work.h"
#include "fsdpx/registrar.h"

namespace fsdpx {

HostServices::~HostServices() = default;
Registrar::~Registrar() = default;

ShardingStrategy::~ShardingStrategy() = default;
WrapPolicy::~WrapPolicy() = default;
PrecisionPolicy::~PrecisionPolicy() = default;
Optimizer::~Optimizer() = default;
void check_shard_range(const std::string& optimizer, size_t first, size_t count, size_t size) {
  if (first <= size && count <= size - first) return;
  throw Error(optimizer + ": step_shards was asked for shards " + std::to_string(first) + " to " +
              std::to_string(first + count) + ", but init() took " + std::to_string(size) +
              "; pass a range of the shards it took");
}
bool Optimizer::can_step_shards() const { return false; }
void Optimizer::step_shards(double, size_t, size_t) {
  throw Error("this optimizer updates all its shards at once only (it does not implement step_shards, "
              "fsdpx/optimizer.h); drop --optimizer-in-backward, or choose adamw, sgd or anyprecision_adamw");
}
CheckpointBackend::~CheckpointBackend() = default;
CheckpointWriter::~CheckpointWriter() = default;
StreamedCheckpointBackend::~StreamedCheckpointBackend() = default;
Model::~Model() = default;
DataSource::~DataSource() = default;

std::string layer_type_name(const torch::nn::Module& module) {
  const std::string& name = module.name();
  const size_t colon = name.rfind("::");
  std::string s = name.substr(colon == std::string::npos ? 0 : colon + 2);
  if (s.size() > 4 && s.compare(s.size() - 4, 4, "Impl") == 0) s.resize(s.size() - 4);
  return s;
}
Evaluable::~Evaluable() = default;
HuggingFaceModel::~HuggingFaceModel() = default;
CheckpointNames::~CheckpointNames() = default;
HeldOutData::~HeldOutData() = default;
OptimizerDevices::~OptimizerDevices() = default;
UnitNameCheck::~UnitNameCheck() = default;
Float8Units::~Float8Units() = default;
Float8AllGather::~Float8AllGather() = default;
LinearWeights::~LinearWeights() = default;
ActivationMemory::~ActivationMemory() = default;
LayerWork::~LayerWork() = default;
LossScaler::~LossScaler() = default;
LossScalingPolicy::~LossScalingPolicy() = default;

}  // namespace fsdpx
