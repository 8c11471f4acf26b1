// fsdpx-ckpt: look into, check and convert checkpoints, offline (no process group).
//   fsdpx-ckpt inspect DIR                       tensors, shapes, dtypes, layout, step, configuration
//   fsdpx-ckpt verify DIR                        re-reads every byte and checks every digest
//   fsdpx-ckpt consolidate DIR OUT.safetensors   one file of whole tensors, one tensor in memory at a time
//   fsdpx-ckpt export-hf DIR OUT_DIR             a Hugging Face directory (config.json, safetensors)
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdpx/error.h"
#include "fsdpx/files.h"
#include "fsdpx/framework/base/dtype_name.h"
#include "fsdpx/framework/base/program_options.h"
#include "fsdpx/framework/checkpoint/checkpointing.h"
#include "fsdpx/framework/checkpoint/safetensors.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/runtime/launcher.h"
#include "fsdpx/hf_interop.h"
#include "fsdpx/interfaces.h"

namespace {

const char* kUsage =
    "usage: fsdpx-ckpt COMMAND ...\n"
    "  inspect DIR                          a table of tensors (shape, dtype, pieces), the step and the configuration\n"
    "  verify DIR                           re-read everything and check every digest and file size\n"
    "  consolidate DIR OUT.safetensors [--no-optimizer]\n"
    "                                       write one safetensors file of whole tensors (bounded memory)\n"
    "  export-hf DIR OUT_DIR [--max-shard-size GB] [--dtype fp32|bf16|fp16]\n"
    "                                       the model as a Hugging Face directory: config.json and model.safetensors,\n"
    "                                       or shards of at most 5 GB (--max-shard-size) with their index, under\n"
    "                                       transformers' names; from_pretrained loads it (the gpt model: Llama)\n"
    "DIR is a checkpoint directory (step-NNNNNNNN) of the sharded or consolidated plugin.\n";

int inspect(const std::string& dir) {
  fsdpx::CheckpointInfo info = fsdpx::inspect_checkpoint(dir);
  std::printf("checkpoint %s\n  format %s, step %lld, saved by %d rank(s), %lld tensors, %.2f MiB\n\n", dir.c_str(),
              info.format.c_str(), static_cast<long long>(info.step), info.world_size,
              static_cast<long long>(info.tensors.size()), static_cast<double>(info.bytes) / (1 << 20));
  size_t w = 6;
  for (const auto& t : info.tensors) w = std::max(w, t.name.size());
  std::printf("  %-*s  %-6s %-20s %s\n", static_cast<int>(w), "tensor", "dtype", "shape",
              "layout (file: first row + rows)");
  for (const auto& t : info.tensors) {
    std::string layout;
    for (const auto& [file, range] : t.pieces)
      layout +=
          (layout.empty() ? "" : ", ") + file + ": " + std::to_string(range.first) + "+" + std::to_string(range.second);
    std::printf("  %-*s  %-6s %-20s %s\n", static_cast<int>(w), t.name.c_str(), t.dtype.c_str(),
                fsdpx::shape_text(t.shape).c_str(), layout.c_str());
  }
  if (!info.trainer_state_json.empty()) std::printf("\ntrainer state: %s\n", info.trainer_state_json.c_str());
  if (!info.config_ini.empty()) std::printf("\nconfiguration:\n%s", info.config_ini.c_str());
  return 0;
}

// The [model] section of the configuration a checkpoint was saved with: its name and options.
std::pair<std::string, std::map<std::string, std::string>> model_section(const std::string& ini,
                                                                         const std::string& dir) {
  // Boost's INI parser, as RunConfig reads --config: [model] key=value arrives as "model.key".
  const auto parsed = fsdpx::parse_ini(ini, boost::program_options::options_description(), dir + "/config.ini");
  std::string name;
  std::map<std::string, std::string> options;
  for (const auto& o : parsed.options) {
    if (o.string_key.rfind("model.", 0) != 0 || o.value.empty()) continue;
    const std::string key = o.string_key.substr(6);
    if (key == "name") name = o.value.front();
    else options[key] = o.value.front();
  }
  if (name.empty())
    throw fsdpx::Error(dir + " records no [model] in its configuration; export-hf needs the model that saved it");
  return {name, options};
}

// A sharded checkpoint names its model in config.ini; without it export-hf said the configuration
// "records no [model]", not which file was missing.
void check_config_ini(const fsdpx::CheckpointInfo& info, const std::string& dir) {
  if (info.format != "fsdpx-sharded") return;
  const std::string kind = fsdpx::file_kind((std::filesystem::path(dir) / "config.ini").string());
  if (kind.empty()) return;
  throw fsdpx::Error(dir + (kind == "missing" ? " has no config.ini" : "/config.ini is " + kind + ", not a file") +
                     "; export-hf needs it for the model that saved the checkpoint (the run directory's config.ini "
                     "is the same file: copy it in)");
}

int export_hf(const std::vector<std::string>& a) {
  fsdpx::HfExportOptions o;
  for (size_t i = 3; i < a.size(); i += 2) {
    if (i + 1 >= a.size()) throw fsdpx::Error(a[i] + " needs a value");
    if (a[i] == "--max-shard-size") {
      double gb = 0;
      const std::string& v = a[i + 1];
      const auto res = std::from_chars(v.data(), v.data() + v.size(), gb);
      if (v.empty() || res.ec != std::errc() || res.ptr != v.data() + v.size() || !(gb > 0 && gb <= 1e6))
        throw fsdpx::Error("--max-shard-size expects a number of GB in (0, 1000000], got '" + v + "'");
      o.max_shard_bytes = static_cast<int64_t>(gb * 1e9);
    } else if (a[i] == "--dtype") {
      const std::string d = a[i + 1];
      if (d != "fp32" && d != "bf16" && d != "fp16")
        throw fsdpx::Error("--dtype must be fp32, bf16 or fp16, got '" + d + "'");
      o.dtype = d == "fp32" ? c10::kFloat : d == "bf16" ? c10::kBFloat16 : c10::kHalf;
    } else {
      throw fsdpx::Error("export-hf: unknown option '" + a[i] + "' (--max-shard-size GB, --dtype fp32|bf16|fp16)");
    }
  }
  const fsdpx::CheckpointInfo info = fsdpx::inspect_checkpoint(a[1]);
  check_config_ini(info, a[1]);
  auto [name, options] = model_section(info.config_ini, a[1]);
  // The names need no weights; config.json is the one the run recorded (the source directory of
  // --model.from_hf may be elsewhere now).
  options.erase("from_hf");
  fsdpx::PluginHost host;
  for (const auto& e : host.discover(fsdpx::PluginSearch{})) throw fsdpx::Error(e);
  auto model = host.create<fsdpx::Model>(name, options);
  auto* hf = dynamic_cast<fsdpx::HuggingFaceModel*>(model.get());
  if (!hf)
    throw fsdpx::Error("model '" + name + "' has no Hugging Face counterpart (it does not offer fsdpx/hf_interop.h)");
  o.hf_name = [hf](const std::string& n) { return hf->hf_name(n); };
  o.config_json = hf->hf_config_json();
  if (!info.trainer_state_json.empty()) {
    const nlohmann::json state = nlohmann::json::parse(info.trainer_state_json, nullptr, /*allow_exceptions=*/false);
    if (state.is_object() && state.contains("hf_config") && state["hf_config"].is_object())
      o.config_json = state["hf_config"].dump();
  }
  const fsdpx::HfExport r = fsdpx::export_hf(a[1], a[2], o);
  std::string files;
  for (const auto& f : r.files) files += (files.empty() ? "" : ", ") + f;
  std::printf("wrote %s: config.json, %s (%lld tensors, %.2f MiB)\n", a[2].c_str(), files.c_str(),
              static_cast<long long>(r.tensors), static_cast<double>(r.bytes) / (1 << 20));
  return 0;
}

int main_body(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.empty() || a[0] == "--help" || a[0] == "-h" || a[0] == "help") {
      std::fputs(kUsage, a.empty() ? stderr : stdout);
      return a.empty() ? 2 : 0;
    }
    if (a[0] == "inspect" && a.size() == 2) return inspect(a[1]);
    if (a[0] == "verify" && a.size() == 2) {
      const int64_t n = fsdpx::verify_checkpoint(a[1]);
      const bool dcp = fsdpx::is_dcp_checkpoint(a[1]);
      std::printf("%s: OK, %lld tensors, %s\n", a[1].c_str(), static_cast<long long>(n),
                  dcp ? "every row read and in one file (PyTorch's DCP records no digests)" : "every digest matches");
      return 0;
    }
    if (a[0] == "consolidate" && (a.size() == 3 || (a.size() == 4 && a[3] == "--no-optimizer"))) {
      fsdpx::consolidate_checkpoint(a[1], a[2], a.size() == 3);
      std::printf("wrote %s\n", a[2].c_str());
      return 0;
    }
    if (a[0] == "export-hf" && a.size() >= 3) return export_hf(a);
    std::fprintf(stderr, "fsdpx-ckpt: unknown command or wrong arguments: '%s'\n%s", a[0].c_str(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdpx-ckpt: %s\n", fsdpx::message_of(e).c_str());
    return 1;
  }
}

}  // namespace

// The process ends without the teardown of LibTorch's static objects (fsdpx::exit_process).
int main(int argc, char** argv) { fsdpx::exit_process(main_body(argc, argv)); }
