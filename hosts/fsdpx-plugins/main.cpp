// fsdpx-plugins: what plugins are installed, what a component's options are, and what a
// configuration resolves to.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <boost/program_options/options_description.hpp>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/build_info.h"
#include "fsdpx/framework/plugin_host/plugin_host.h"
#include "fsdpx/framework/plugin_host/run_config.h"
#include "fsdpx/framework/runtime/launcher.h"
#include "fsdpx/suggest.h"
#include "fsdpx/framework/engine/unit_plan.h"
#include "fsdpx/model.h"
#include "fsdpx/optimizer.h"
#include "fsdpx/precision_policy.h"

#include <ATen/ops/zeros.h>

namespace {

constexpr const char* kUsage = R"(usage: fsdpx-plugins [PLUGIN OPTIONS] COMMAND [ARGS]

commands:
  list                    table of installed components: kind, name, version, file
  show NAME               a component's options with types, defaults and help
                          (NAME or KIND.NAME, e.g. size_based or wrap.size_based)
  config [OPTIONS]        resolve a configuration (--config FILE, --<section>.<option> VALUE)
                          and print it as the INI file that reproduces it
  plan [OPTIONS]          the sharding units a wrap policy makes of a model: parameters per
                          unit, largest/smallest ratio (needs --model.name and --wrap.name;
                          nothing is allocated, so any model size plans at once)
  explain [OPTIONS]       the precision audit: for a precision policy (--precision.name) and,
                          optionally, an optimizer (--optimizer.name), the dtype of storage,
                          compute, all-gather, reduce, gradient and each optimizer state; with
                          --model.name and --wrap.name, each unit's compute and reduce dtypes
  info                    versions: fsdpx, plugin ABI, LibTorch, C++ ABI, CUDA, NCCL
  help                    this text

plugin options (anywhere on the line):
  --plugin-dir DIR              also load every plugin in DIR (repeatable)
  --plugin FILE                 also load the plugin FILE (repeatable)
  --no-default-plugins          skip <prefix>/lib/fsdpx/plugins and FSDPX_PLUGIN_PATH
  --allow-insecure-plugin-dir   load from directories that others can write to
  --skip-broken-plugins         a file of a scanned folder that fails to load only warns

Plugins are searched in <prefix>/lib/fsdpx/plugins, then FSDPX_PLUGIN_PATH (':'-separated),
then --plugin-dir and --plugin. A plugin file that fails to load is an error, as in fsdpx-train:
every plugin that loads is still listed. Exit status: 0 on success (warnings included), 1 on any
error, 2 on bad usage.
)";

struct Cli {
  fsdpx::PluginSearch search;
  std::string command;
  std::vector<std::string> args;
};

// Takes the plugin options out of argv wherever they are; the first other word is the command.
Cli parse_cli(int argc, char** argv) {
  Cli cli;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (a.size() > flag.size() && a.compare(0, flag.size() + 1, flag + "=") == 0)
        return a.substr(flag.size() + 1);
      if (i + 1 >= argc) throw fsdpx::Error(flag + " needs a value");
      return argv[++i];
    };
    if (a == "--plugin-dir" || a.rfind("--plugin-dir=", 0) == 0) {
      cli.search.dirs.emplace_back(value("--plugin-dir"));
    } else if (a == "--plugin" || a.rfind("--plugin=", 0) == 0) {
      cli.search.files.emplace_back(value("--plugin"));
    } else if (a == "--no-default-plugins") {
      cli.search.default_dir = false;
      cli.search.environment = false;
    } else if (a == "--allow-insecure-plugin-dir") {
      cli.search.allow_insecure = true;
    } else if (a == "--skip-broken-plugins") {
      cli.search.skip_broken = true;
    } else if (cli.command.empty() && (a == "-h" || a == "--help")) {
      cli.command = "help";
    } else if (cli.command.empty() && !a.empty() && a[0] != '-') {
      cli.command = a;
    } else if (cli.command.empty()) {
      throw fsdpx::Error("unknown option " + a + " before the command; see fsdpx-plugins help");
    } else {
      cli.args.push_back(a);
    }
  }
  return cli;
}

int cmd_list(const fsdpx::PluginHost& host) {
  std::vector<std::vector<std::string>> rows = {{"kind", "name", "version", "file"}};
  for (const auto* c : host.components()) {
    rows.push_back({fsdpx::section_name(c->spec.kind), c->spec.name, c->plugin->version,
                    c->plugin->path.string()});
  }
  std::vector<size_t> width(4, 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < 4; ++i) width[i] = std::max(width[i], r[i].size());
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < 4; ++i)
      line += r[i] + (i + 1 < 4 ? std::string(width[i] - r[i].size() + 2, ' ') : "");
    std::printf("%s\n", line.c_str());
  }
  if (rows.size() == 1) std::printf("(no plugins found)\n");
  return 0;
}

int cmd_show(const fsdpx::PluginHost& host, const std::vector<std::string>& args) {
  if (args.size() != 1) throw fsdpx::Error("show takes one component name, e.g. `show size_based`");
  std::string name = args[0];
  std::vector<const fsdpx::ComponentRecord*> matches;
  auto dot = name.find('.');
  if (dot != std::string::npos) {
    auto kind = fsdpx::kind_from_section(name.substr(0, dot));
    if (!kind) {
      std::vector<std::string> sections;
      for (auto k : fsdpx::all_kinds()) sections.push_back(fsdpx::section_name(k));
      throw fsdpx::Error("unknown kind '" + name.substr(0, dot) + "' in '" + name + "'" +
                         fsdpx::did_you_mean(name.substr(0, dot), sections) +
                         " Kinds: " + fsdpx::join_names(sections) + ".");
    }
    matches.push_back(&host.find(*kind, name.substr(dot + 1)));
  } else {
    std::vector<std::string> all;
    for (const auto* c : host.components()) {
      if (c->spec.name == name) matches.push_back(c);
      all.push_back(c->spec.name);
    }
    if (matches.empty())
      throw fsdpx::Error("no installed component is named '" + name + "'" +
                         fsdpx::did_you_mean(name, all) + " See `fsdpx-plugins list`.");
  }
  if (matches.size() > 1) {
    std::vector<std::string> q;
    for (const auto* c : matches) q.push_back(std::string(fsdpx::section_name(c->spec.kind)) + "." + name);
    throw fsdpx::Error("'" + name + "' names more than one component; say which: " + fsdpx::join_names(q));
  }
  std::printf("%s", fsdpx::describe_component(*matches[0]).c_str());
  return 0;
}

int cmd_config(const fsdpx::PluginHost& host, const std::vector<std::string>& args) {
  auto config = fsdpx::RunConfig::resolve(host, args, fsdpx::ConfigRequest{});
  std::printf("%s", config.to_ini().c_str());
  return 0;
}

int cmd_plan(const fsdpx::PluginHost& host, const std::vector<std::string>& args) {
  auto config = fsdpx::RunConfig::resolve(host, args, fsdpx::ConfigRequest{});
  const auto* model_choice = config.choice(fsdpx::Kind::Model);
  const auto* wrap_choice = config.choice(fsdpx::Kind::Wrap);
  if (!model_choice || !wrap_choice)
    throw fsdpx::Error(
        "plan needs a model and a wrap policy: --model.name NAME --wrap.name NAME (or [model] and [wrap] in --config)");
  auto model = host.create<fsdpx::Model>(model_choice->name, model_choice->options);
  auto policy = host.create<fsdpx::WrapPolicy>(wrap_choice->name, wrap_choice->options);
  auto root = model->module();
  auto plan = fsdpx::plan_units(*root, policy->select(*root));
  std::printf("model %s, wrap policy %s\n%s", model_choice->name.c_str(), wrap_choice->name.c_str(),
              plan.table().c_str());
  return 0;
}

int cmd_explain(const fsdpx::PluginHost& host, const std::vector<std::string>& args) {
  auto config =
      fsdpx::RunConfig::resolve(host, args, fsdpx::ConfigRequest{nullptr, {{fsdpx::Kind::Precision, "fp32"}}, {}});
  const auto* precision = config.choice(fsdpx::Kind::Precision);
  auto spec = host.create<fsdpx::PrecisionPolicy>(precision->name, precision->options)->spec("");
  auto name = [](c10::ScalarType t) { return std::string(c10::toString(t)); };
  std::vector<std::pair<std::string, std::string>> rows = {
      {"storage (sharded parameters)", name(spec.storage)},
      {"compute (forward/backward)", name(spec.compute)},
      {"all-gather", name(spec.compute)},
      {"reduce-scatter / all-reduce", name(spec.reduce)},
      {"gradient (sharded, for the optimizer)", name(spec.gradient)},
      {"model output (loss)", spec.output ? name(*spec.output) : "as computed"}};
  if (const auto* opt = config.choice(fsdpx::Kind::Optimizer)) {
    auto optimizer = host.create<fsdpx::Optimizer>(opt->name, opt->options);
    at::Tensor probe = at::zeros({1}, at::TensorOptions().dtype(spec.storage)).requires_grad_(true);
    optimizer->init({{"probe", probe}});
    for (const auto& [key, t] : optimizer->state("probe"))
      if (t.dim() > 0) rows.emplace_back("optimizer state " + key + " (" + opt->name + ")", name(t.scalar_type()));
  }
  const auto* model_choice = config.choice(fsdpx::Kind::Model);
  const auto* wrap_choice = config.choice(fsdpx::Kind::Wrap);
  const bool per_unit = model_choice && wrap_choice;
  std::printf("precision %s, for %s\n", precision->name.c_str(), per_unit ? "the root unit" : "all parameters");
  for (const auto& [what, dtype] : rows) std::printf("  %-44s %s\n", what.c_str(), dtype.c_str());
  if (!per_unit) return 0;
  // With a model and a wrap policy: every unit's own answer (compute and all-gather, reduce).
  auto policy = host.create<fsdpx::PrecisionPolicy>(precision->name, precision->options);
  auto model = host.create<fsdpx::Model>(model_choice->name, model_choice->options);
  auto wrap = host.create<fsdpx::WrapPolicy>(wrap_choice->name, wrap_choice->options);
  auto root = model->module();
  const auto plan = fsdpx::plan_units(*root, wrap->select(*root));
  std::printf("per unit (model %s, wrap policy %s): compute and all-gather / reduce\n", model_choice->name.c_str(),
              wrap_choice->name.c_str());
  for (const auto& u : plan.units) {
    const auto s = policy->spec(u.fqn);
    std::printf("  %-44s %s / %s\n", u.fqn.empty() ? "(root)" : u.fqn.c_str(), name(s.compute).c_str(),
                name(s.reduce).c_str());
  }
  return 0;
}

int cmd_info() {
  auto b = fsdpx::build_info();
  std::printf("fsdpx         %s\n", b.fsdpx_version.c_str());
  std::printf("plugin ABI    %d.%d\n", b.abi_major, b.abi_minor);
  std::printf("LibTorch      %s (_GLIBCXX_USE_CXX11_ABI=%d)\n", b.torch_version.c_str(), b.cxx11_abi);
  if (b.cuda_build && b.cuda_version.empty()) {  // libfsdpx_cuda.so did not load
    std::printf("CUDA          %s\n", b.cuda_status.c_str());
  } else if (b.cuda_build) {
    std::printf("CUDA          %s, NCCL %s\n", b.cuda_version.c_str(), b.nccl_version.c_str());
    std::printf("CUDA devices  %d%s%s\n", b.cuda_devices, b.cuda_status.empty() ? "" : " (",
                b.cuda_status.empty() ? "" : (b.cuda_status + ")").c_str());
  } else {
    std::printf("CUDA          %s\n", b.cuda_status.c_str());
  }
  std::printf("plugin dir    %s\n", fsdpx::PluginHost::default_plugin_dir().c_str());
  return 0;
}

int main_body(int argc, char** argv) {
  Cli cli;
  try {
    cli = parse_cli(argc, argv);
  } catch (const fsdpx::Error& e) {
    std::fprintf(stderr, "fsdpx-plugins: %s\n", e.what());
    return 2;
  }
  if (cli.command.empty() || cli.command == "help") {
    std::printf("%s", kUsage);
    return cli.command.empty() ? 2 : 0;
  }
  if (cli.command == "info") return cmd_info();
  const std::vector<std::string> commands = {"list", "show", "config", "plan", "explain", "info", "help"};
  if (cli.command != "list" && cli.command != "show" && cli.command != "config" && cli.command != "plan" &&
      cli.command != "explain") {
    std::string dym = fsdpx::did_you_mean(cli.command, commands);
    std::fprintf(stderr, "fsdpx-plugins: unknown command '%s'%s Commands: %s.\n", cli.command.c_str(),
                 dym.empty() ? "." : dym.c_str(), fsdpx::join_names(commands).c_str());
    return 2;
  }
  try {
    fsdpx::PluginHost host;
    // Every plugin that loads is still shown; any error makes the exit status 1 (a broken file
    // under --skip-broken-plugins is a warning, as fsdpx-train has it).
    const auto found = host.discover_all(cli.search);
    for (const auto& e : found.errors) std::fprintf(stderr, "fsdpx-plugins: %s\n", e.c_str());
    for (const auto& w : found.warnings) std::fprintf(stderr, "fsdpx-plugins: warning: %s\n", w.c_str());
    int status = found.errors.empty() ? 0 : 1;
    int rc = 0;
    if (cli.command == "list") rc = cmd_list(host);
    if (cli.command == "show") rc = cmd_show(host, cli.args);
    if (cli.command == "config") rc = cmd_config(host, cli.args);
    if (cli.command == "plan") rc = cmd_plan(host, cli.args);
    if (cli.command == "explain") rc = cmd_explain(host, cli.args);
    return rc != 0 ? rc : status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdpx-plugins: %s\n", fsdpx::message_of(e).c_str());
    return 1;
  }
}

}  // namespace

// The process ends without the teardown of LibTorch's static objects (fsdpx::exit_process).
int main(int argc, char** argv) { fsdpx::exit_process(main_body(argc, argv)); }
