// fsdpx/hf_config.h: reading a Hugging Face model directory's config.json, for models that offer
// fsdpx/hf_interop.h (gpt reads Llama's, t5 T5's). Header-only, over nlohmann/json (Debian's
// nlohmann-json3-dev), which a plugin using it includes and links as it would any header library.
#pragma once

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "fsdpx/error.h"
#include "fsdpx/files.h"

namespace fsdpx::hf {

// DIR/config.json as a JSON object (what --model.from_hf=DIR names). fsdpx::Error naming the
// file: not there (a Hugging Face model directory is what save_pretrained writes), not readable,
// not JSON, or not an object.
inline nlohmann::json read_config(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir) / "config.json";
  if (file_kind(p.string()) != "missing") check_input_file(p.string(), "--model.from_hf's");
  std::ifstream in(p);
  if (!in)
    throw Error("--model.from_hf " + dir +
                ": no config.json there; give a Hugging Face model directory (what save_pretrained writes)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    nlohmann::json j = nlohmann::json::parse(text.str());
    if (!j.is_object()) throw Error("not a JSON object");
    return j;
  } catch (const std::exception& e) {
    throw Error(p.string() + " is not valid JSON: " + e.what());
  }
}

// The value of `key` in `j` (read from `file`) as the JSON type `T` (bool, an integer, a floating
// type or std::string); `fallback` when absent or null. Without a fallback the key is required:
// fsdpx::Error "FILE has no 'KEY'; a MODEL config.json needs it" (`model`: "Llama", "T5"). A value
// of another type: "FILE: 'KEY' is VALUE, not an integer" (a boolean, a number, a string).
template <class T>
T config_value(const nlohmann::json& j, const std::string& file, const char* key, const std::string& model,
               std::optional<T> fallback = std::nullopt) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    throw Error(file + " has no '" + key + "'; a " + model + " config.json needs it");
  }
  try {
    return j[key].get<T>();
  } catch (const std::exception&) {
    throw Error(file + ": '" + key + "' is " + j[key].dump() + ", not " +
                (std::is_same<T, bool>::value          ? "a boolean"
                 : std::is_floating_point<T>::value    ? "a number"
                 : std::is_same<T, std::string>::value ? "a string"
                                                       : "an integer"));
  }
}

}  // namespace fsdpx::hf
