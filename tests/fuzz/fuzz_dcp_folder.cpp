// A folder PyTorch's DCP wrote, as fsdpx reads it (its index from the files' DCP_SHARDING_INFO, the
// names a run's tensors are found under, inspect and verify): the input is one rank's safetensors
// file; beside it lies another rank's (tests/fuzz/data), whose rows the input's must join.
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fsdpx::fuzz::scratch() / "dcp";
  const auto other = dir / "shard-00002-model-00001-of-00001.safetensors";
  if (!std::filesystem::exists(other)) {
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(std::filesystem::path(FSDPX_FUZZ_DATA_DIR) / "dcp-shard-00002.safetensors", other);
  }
  fsdpx::fuzz::write("dcp/shard-00001-model-00001-of-00001.safetensors", data, size);
  fsdpx::fuzz::expect_clear_errors([&] {
    fsdpx::dcp_names(dir.string(), {"w", "optim/w/exp_avg", "optim/w/step"},
                     [](const std::string& n) { return std::vector<std::string>{n + ".weight"}; });
  });
  fsdpx::fuzz::expect_clear_errors([&] { fsdpx::inspect_checkpoint(dir.string()); });
  fsdpx::fuzz::expect_clear_errors([&] { fsdpx::verify_checkpoint(dir.string()); });
  return 0;
}
