#include "test_paths.h"

#include "fsdpx/framework/runtime/launcher.h"

#include "test_config.h"
#include "fsdpx/error.h"
#include <c10/util/Exception.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fsdpx::test {
namespace fs = std::filesystem;

fs::path build_dir() { return FSDPX_TEST_BUILD_DIR; }
fs::path source_dir() { return FSDPX_TEST_SOURCE_DIR; }

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string venv_python() { return FSDPX_TEST_PYTHON; }
fs::path fixture_dir() { return build_dir() / "tests" / "fixtures"; }
fs::path plugin_dir() { return build_dir() / "lib" / "fsdpx" / "plugins"; }
fs::path bin_dir() { return build_dir() / "bin"; }
std::string train() { return (bin_dir() / "fsdpx-train").string(); }
std::string ckpt() { return (bin_dir() / "fsdpx-ckpt").string(); }
std::string engine_worker() { return (build_dir() / "tests" / "engine_worker").string(); }
std::string comm_worker() { return (build_dir() / "tests" / "comm_worker").string(); }
std::string hf_worker() { return (build_dir() / "tests" / "hf_worker").string(); }
fs::path fixture(const std::string& name) { return fixture_dir() / ("fixture_" + name + ".so"); }

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "fsdpx-test-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::permissions(path_, fs::perms::owner_all, fs::perm_options::replace, ec);
  fs::remove_all(path_, ec);
}

namespace {
// `message` of the E that `f` throws, or "(no error)".
template <class E, class Message>
std::string message_of(const std::function<void()>& f, Message message) {
  try {
    f();
  } catch (const E& e) {
    return message(e);
  }
  return "(no error)";
}
}  // namespace

std::string error_of(const std::function<void()>& f) {
  return message_of<fsdpx::Error>(f, [](const fsdpx::Error& e) { return std::string(e.what()); });
}

std::string torch_error_of(const std::function<void()>& f) {
  return message_of<c10::Error>(f, [](const c10::Error& e) { return std::string(e.what_without_backtrace()); });
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

CommandResult run_command(const std::string& command, int timeout_s) {
  TempDir dir;
  const fs::path out = dir.path() / "out", err = dir.path() / "err";
  const std::string full =
      "timeout " + std::to_string(timeout_s) + " " + command + " >" + out.string() + " 2>" + err.string();
  int status = std::system(full.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

bool under_sanitizers() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#endif
#endif
  return false;
}

int free_port() { return pick_rendezvous_port("127.0.0.1"); }

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  return nlohmann::json::parse(in);
}

std::vector<nlohmann::json> read_json_lines(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<nlohmann::json> step_metrics(const fs::path& run_dir) {
  std::vector<nlohmann::json> out;
  for (auto& j : read_json_lines(run_dir / "metrics.jsonl"))
    if (j.contains("loss")) out.push_back(std::move(j));
  return out;
}

std::map<std::string, std::string> tensor_digests(const fs::path& checkpoint, bool with_optimizer) {
  const nlohmann::json ix = read_json(checkpoint / "index.json");
  std::map<std::string, std::string> out;
  for (auto it = ix["tensors"].begin(); it != ix["tensors"].end(); ++it)
    if (with_optimizer || it.key().rfind("optim/", 0) != 0) out[it.key()] = it.value()["digest"];
  return out;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string csv_path() {
  auto r = run_command("bash " + (build_dir().parent_path() / "scripts" / "setup.sh").string() +
                       " --print-breast-cancer-csv 2>/dev/null");
  std::string p = r.out;
  while (!p.empty() && (p.back() == '\n' || p.back() == '\r')) p.pop_back();
  return p;
}

}  // namespace fsdpx::test
