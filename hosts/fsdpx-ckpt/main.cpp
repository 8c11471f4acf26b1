// fsdpx-ckpt: look into, check and convert checkpoints, offline (no process group).
//   fsdpx-ckpt inspect DIR                       tensors, shapes, dtypes, layout, step, configuration
//   fsdpx-ckpt verify DIR                        re-reads every byte and checks every digest
//   fsdpx-ckpt consolidate DIR OUT.safetensors   one file of whole tensors, one tensor in memory at a time
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"

namespace {

const char* kUsage =
    "usage: fsdpx-ckpt COMMAND ...\n"
    "  inspect DIR                          a table of tensors (shape, dtype, pieces), the step and the configuration\n"
    "  verify DIR                           re-read everything and check every digest and file size\n"
    "  consolidate DIR OUT.safetensors [--no-optimizer]\n"
    "                                       write one safetensors file of whole tensors (bounded memory)\n"
    "DIR is a checkpoint directory (step-NNNNNNNN) of the sharded or consolidated plugin.\n";

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int inspect(const std::string& dir) {
  fsdpx::CheckpointInfo info = fsdpx::inspect_checkpoint(dir);
  std::printf("checkpoint %s\n  format %s, step %lld, saved by %d rank(s), %lld tensors, %.2f MiB\n\n", dir.c_str(),
              info.format.c_str(), static_cast<long long>(info.step), info.world_size,
              static_cast<long long>(info.tensors.size()), static_cast<double>(info.bytes) / (1 << 20));
  size_t w = 6;
  for (const auto& t : info.tensors) w = std::max(w, t.name.size());
  std::printf("  %-*s  %-6s %-20s %s\n", static_cast<int>(w), "tensor", "dtype", "shape", "layout (file: first row + rows)");
  for (const auto& t : info.tensors) {
    std::string layout;
    for (const auto& [file, range] : t.pieces)
      layout += (layout.empty() ? "" : ", ") + file + ": " + std::to_string(range.first) + "+" + std::to_string(range.second);
    std::printf("  %-*s  %-6s %-20s %s\n", static_cast<int>(w), t.name.c_str(), t.dtype.c_str(), shape_text(t.shape).c_str(),
                layout.c_str());
  }
  if (!info.trainer_state_json.empty()) std::printf("\ntrainer state: %s\n", info.trainer_state_json.c_str());
  if (!info.config_ini.empty()) std::printf("\nconfiguration:\n%s", info.config_ini.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.empty() || a[0] == "--help" || a[0] == "-h" || a[0] == "help") {
      std::fputs(kUsage, a.empty() ? stderr : stdout);
      return a.empty() ? 2 : 0;
    }
    if (a[0] == "inspect" && a.size() == 2) return inspect(a[1]);
    if (a[0] == "verify" && a.size() == 2) {
      const int64_t n = fsdpx::verify_checkpoint(a[1]);
      std::printf("%s: OK, %lld tensors, every digest matches\n", a[1].c_str(), static_cast<long long>(n));
      return 0;
    }
    if (a[0] == "consolidate" && (a.size() == 3 || (a.size() == 4 && a[3] == "--no-optimizer"))) {
      fsdpx::consolidate_checkpoint(a[1], a[2], a.size() == 3);
      std::printf("wrote %s\n", a[2].c_str());
      return 0;
    }
    std::fprintf(stderr, "fsdpx-ckpt: unknown command or wrong arguments: '%s'\n%s", a[0].c_str(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdpx-ckpt: %s\n", e.what());
    return 1;
  }
}
