// A sharded checkpoint's index.json and trainer_state.json, as fsdpx-ckpt inspect and verify
// read them: the input is index.json, and its first line is trainer_state.json. Beside them lies
// the rank file of a real checkpoint (tests/fuzz/data, whose index is in the corpus), so the
// fuzzed index's pieces, offsets, shapes and digests are checked against real data.
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fsdpx::fuzz::scratch() / "step-00000001";
  if (!std::filesystem::exists(dir / "rank-00000.safetensors")) {
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(std::filesystem::path(FSDPX_FUZZ_DATA_DIR) / "rank-00000.safetensors",
                               dir / "rank-00000.safetensors");
  }
  fsdpx::fuzz::write("step-00000001/index.json", data, size);
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string first = text.substr(0, text.find('\n'));
  fsdpx::fuzz::write("step-00000001/trainer_state.json", reinterpret_cast<const uint8_t*>(first.data()), first.size());
  fsdpx::fuzz::expect_clear_errors([&] { fsdpx::inspect_checkpoint(dir.string()); });
  fsdpx::fuzz::expect_clear_errors([&] { fsdpx::verify_checkpoint(dir.string()); });
  return 0;
}
