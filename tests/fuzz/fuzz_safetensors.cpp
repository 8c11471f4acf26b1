// The safetensors reader on arbitrary files: header length, JSON header, entries, byte ranges.
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fsdpx::fuzz::write("model.safetensors", data, size);
  fsdpx::fuzz::expect_clear_errors([&] {
    fsdpx::SafetensorsReader r(path.string());
    for (const auto& [name, e] : r.entries()) {
      r.read_rows(name, 0, std::min<int64_t>(e.rows(), 4));
      if (e.rows() > 1) r.read_rows(name, e.rows() - 1, 1);
    }
  });
  return 0;
}
