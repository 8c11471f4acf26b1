// A sharded checkpoint's index.json: read and checked for format and version, its shapes and pieces.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdpx::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A sharded checkpoint's index.json, checked for format and version.
struct Index {
  json j;
  fs::path dir;
};
Index read_index(const std::string& dir);
std::vector<int64_t> json_shape(const json& j, const std::string& where);

struct Piece {
  std::string file;
  int64_t offset, rows;
};
std::vector<Piece> pieces_of(const json& entry, const std::string& where);

}  // namespace fsdpx::ckpt
