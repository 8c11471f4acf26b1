#include "fsdpx/framework/checkpoint/output_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "fsdpx/error.h"
#include "fsdpx/files.h"

namespace fs = std::filesystem;

namespace fsdpx {
namespace {

fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::absolute(p).lexically_normal() : r;
}

// What lies at `p` itself (a symlink is not followed): "" for nothing, else a description.
std::string entry_kind(const std::string& p) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return "";
  if (S_ISLNK(st.st_mode)) return "a symlink";
  const std::string kind = file_kind(p);
  return kind.empty() ? "a file" : kind;
}

void check_inputs(const std::string& out, const std::string& what, const std::vector<NamedPath>& inputs) {
  for (const auto& [name, in] : inputs) {
    if (in.empty()) continue;
    if (lies_within(out, in))
      throw Error(what + " " + out + (resolved(out) == resolved(in) ? " is " : " lies inside ") + name + " " + in +
                  ", which it reads; write it elsewhere");
  }
}

void check_parent(const std::string& out, const std::string& what) {
  const fs::path parent = fs::absolute(out).parent_path();
  if (file_kind(parent.string()) != "a directory")
    throw Error(what + " " + out + ": its directory " + parent.string() + " does not exist");
}

}  // namespace

bool lies_within(const std::string& path, const std::string& container) {
  const fs::path p = resolved(path), c = resolved(container);
  auto pi = p.begin(), ci = c.begin();
  for (; ci != c.end(); ++ci, ++pi) {
    if (ci->empty() && std::next(ci) == c.end()) break;  // "dir/" ends with an empty element
    if (pi == p.end() || *pi != *ci) return false;
  }
  return true;
}

void check_output_file(const std::string& out, const std::string& what, const std::vector<NamedPath>& inputs) {
  if (out.empty()) throw Error(what + " is empty; give a file name");
  check_inputs(out, what, inputs);
  const std::string kind = entry_kind(out);
  if (!kind.empty() && kind != "a file")
    throw Error(what + " " + out + " is " + kind + "; give a new file, or a regular file to replace");
  check_parent(out, what);
}

void check_output_dir(const std::string& out, const std::string& what, const std::vector<NamedPath>& inputs) {
  if (out.empty()) throw Error(what + " is empty; give a directory");
  check_inputs(out, what, inputs);
  for (const auto& [name, in] : inputs)
    if (!in.empty() && lies_within(in, out))
      throw Error(what + " " + out + " holds " + name + " " + in + ", which it reads; write it elsewhere");
  const std::string kind = entry_kind(out);
  std::error_code ec;
  if (!kind.empty() && (kind != "a directory" || !fs::is_empty(out, ec)))
    throw Error(what + " " + out + " exists and is " + (kind == "a directory" ? "not empty" : kind) +
                "; give a new or empty directory");
  check_parent(out, what);
}

TempOutput::TempOutput(std::string out) : out_(std::move(out)) {
  tmp_ = out_ + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // this process's own name: what is there is a leftover of a dead one
}

TempOutput::~TempOutput() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void TempOutput::commit() {
  std::error_code ec;
  if (fs::is_directory(tmp_, ec) && fs::is_directory(out_, ec) && fs::is_empty(out_, ec)) fs::remove(out_, ec);
  fs::rename(tmp_, out_, ec);
  if (ec) throw Error("cannot move " + tmp_ + " to " + out_ + ": " + ec.message());
  committed_ = true;
}

}  // namespace fsdpx
