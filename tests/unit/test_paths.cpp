#include "test_paths.h"

#include "fsdpx/framework/runtime/launcher.h"

#include "test_config.h"
#include "fsdpx/error.h"
#include <c10/util/Exception.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

namespace {

// The venv's site-packages (lib/python3.X/site-packages beside its bin/python), empty if none.
fs::path site_packages() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(venv_python()).parent_path().parent_path() / "lib", ec))
    if (e.path().filename().string().rfind("python3", 0) == 0 && fs::is_directory(e.path() / "site-packages"))
      return e.path() / "site-packages";
  return {};
}

// The installed version of a package, from its dist-info directory's name ("" if not installed).
std::string dist_info(const std::string& package) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(site_packages(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(package + "-", 0) == 0 && e.path().extension() == ".dist-info") return name;
  }
  return "";
}

}  // namespace

std::string csv_path() {
  const fs::path csv = site_packages() / "sklearn" / "datasets" / "data" / "breast_cancer.csv";
  if (fs::exists(csv)) return csv.string();
  auto r = run_command("bash " + (source_dir() / "scripts" / "setup.sh").string() +
                       " --print-breast-cancer-csv 2>/dev/null");
  std::string p = r.out;
  while (!p.empty() && (p.back() == '\n' || p.back() == '\r')) p.pop_back();
  return p;
}

namespace {

// An exclusive flock on `path` (created if absent), held until the object goes.
class FileLock {
 public:
  explicit FileLock(const fs::path& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    int rc = -1;
    if (fd_ >= 0)
      do rc = ::flock(fd_, LOCK_EX);
      while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      if (fd_ >= 0) ::close(fd_);
      throw std::runtime_error("cannot lock " + path.string() + ": " + std::strerror(errno));
    }
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace

void hf_models(const std::string& script, const std::vector<std::string>& all_variants,
               const std::function<std::string(const std::string&, const std::string&)>& arg, const fs::path& dir,
               const std::vector<std::pair<std::string, std::string>>& name_variant) {
  const fs::path script_path = source_dir() / "tests" / "hf" / script;
  const std::string stem = fs::path(script).stem().string();
  // Everything the files depend on: the script, its arguments, the packages that write them.
  std::string inputs = read_file(script_path) + "\n" + venv_python();
  for (const auto& v : all_variants) inputs += "\n" + arg(v, "DIR");
  for (const char* package : {"torch", "transformers", "safetensors", "huggingface_hub", "tokenizers"})
    inputs += "\n" + dist_info(package);
  const fs::path root = build_dir() / "tests" / "hf_models";
  const fs::path made = root / (stem + "-" + std::to_string(std::hash<std::string>{}(inputs)));
  auto variant_dir = [&made](const std::string& variant) {
    std::string name = variant.empty() ? "plain" : variant;
    for (char& c : name)
      if (c == ',' || c == '=' || c == '/') c = '_';
    return made / name;
  };
  fs::create_directories(root);
  {
    const FileLock lock(root / (stem + ".lock"));
    if (!fs::exists(made)) {  // made whole or not at all: a test stopped halfway leaves no half
      std::vector<fs::path> earlier;  // the models of earlier inputs, and a partial one
      for (const auto& e : fs::directory_iterator(root))
        if (e.is_directory() && e.path().filename().string().rfind(stem + "-", 0) == 0) earlier.push_back(e.path());
      for (const auto& p : earlier) fs::remove_all(p);
      const fs::path partial = made.string() + ".partial";
      fs::create_directories(partial);
      std::string cmd = venv_python() + " " + script_path.string();
      for (const auto& v : all_variants) cmd += " " + arg(v, (partial / variant_dir(v).filename()).string());
      const CommandResult r = run_command(cmd);
      if (r.exit_code != 0) {
        fs::remove_all(partial);
        throw std::runtime_error(cmd + " exited " + std::to_string(r.exit_code) + ":\n" + r.out + r.err);
      }
      fs::rename(partial, made);
    }
  }
  for (const auto& [name, variant] : name_variant) {
    const fs::path from = variant_dir(variant);
    if (!fs::exists(from)) throw std::runtime_error(script + " has no variant '" + variant + "' in " + made.string());
    fs::copy(from, dir / name, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    fs::copy_file(from.string() + ".logits.safetensors", (dir / name).string() + ".logits.safetensors",
                  fs::copy_options::overwrite_existing);
  }
}

}  // namespace fsdpx::test
