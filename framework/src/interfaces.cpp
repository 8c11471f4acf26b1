// Out-of-line destructors of the public interfaces, so that their type information and vtables
// live in libfsdpx alone (one definition shared by the host and every plugin).
#include "fsdpx/error.h"
#include "fsdpx/interfaces.h"
#include "fsdpx/registrar.h"

namespace fsdpx {

Error::Error(const std::string& message) : std::runtime_error(message) {}
Error::~Error() = default;

HostServices::~HostServices() = default;
Registrar::~Registrar() = default;

ShardingStrategy::~ShardingStrategy() = default;
WrapPolicy::~WrapPolicy() = default;
PrecisionPolicy::~PrecisionPolicy() = default;
Optimizer::~Optimizer() = default;
CheckpointBackend::~CheckpointBackend() = default;
Model::~Model() = default;
DataSource::~DataSource() = default;
Evaluable::~Evaluable() = default;
HeldOutData::~HeldOutData() = default;
OptimizerDevices::~OptimizerDevices() = default;

}  // namespace fsdpx
