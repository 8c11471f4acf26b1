// A checkpoint's files: text and JSON read and written, the step a file records, a save swapped into place.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace fsdpx::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_text(const fs::path& p);
// Written and fsynced, so that a checkpoint renamed into place survives a crash.
void write_text(const fs::path& p, const std::string& text);
int64_t parse_step(const std::string& text, const std::string& where);
json parse_json_file(const fs::path& p);

// Replaces `final_dir` by `tmp`. The old checkpoint is moved aside first and removed last; if
// the process dies in between, recover_interrupted_saves moves it back.
void swap_into_place(const fs::path& tmp, const fs::path& final_dir);

}  // namespace fsdpx::ckpt
