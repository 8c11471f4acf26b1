// A checkpoint's files: text and JSON read and written, the step a file records, a save swapped into place.
#include "checkpoint_files.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>

#include "fsdpx/error.h"
#include "fsdpx/framework/checkpoint/synced_files.h"

namespace fsdpx::ckpt {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p.string() + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Written and fsynced, so that a checkpoint renamed into place survives a crash.
void write_text(const fs::path& p, const std::string& text) { write_file_synced(p.string(), text); }

int64_t parse_step(const std::string& text, const std::string& where) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 0) throw Error(where + ": step '" + text + "' is not a step number");
  return v;
}

json parse_json_file(const fs::path& p) {
  try {
    return json::parse(read_text(p));
  } catch (const json::exception& e) {
    throw Error(p.string() + ": not valid JSON (" + e.what() + ")");
  }
}

// Replaces `final_dir` by `tmp`. The old checkpoint is moved aside first and removed last; if
// the process dies in between, recover_interrupted_saves moves it back.
void swap_into_place(const fs::path& tmp, const fs::path& final_dir) {
  const fs::path root = final_dir.parent_path();
  std::error_code ec;
  if (fs::exists(final_dir)) {
    const fs::path old = root / (".old-" + final_dir.filename().string());
    fs::remove_all(old, ec);
    fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_directory(root.string());
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp, final_dir);
  }
  fsync_directory(root.string());
}

}  // namespace fsdpx::ckpt
