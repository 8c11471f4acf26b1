// fsdpx/safetensors_file.h: reading a safetensors file's tensors, for plugins whose data comes
// as one (the images data source's images and labels). Checkpoints have their own formats
// (fsdpx/checkpoint_formats.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdpx/export.h"

namespace fsdpx {

// A tensor's dtype and shape as the file's header gives them.
struct SafetensorsTensorInfo {
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
};

// The file's tensors by name. fsdpx::Error naming the file: missing, not safetensors, damaged,
// or a dtype LibTorch has no type for.
FSDPX_API std::map<std::string, SafetensorsTensorInfo> safetensors_tensors(const std::string& path);
// Tensor `name` of the file, whole, on the CPU; fsdpx::Error naming the file and the tensors it
// holds when it has no such tensor.
FSDPX_API at::Tensor read_safetensors_tensor(const std::string& path, const std::string& name);

}  // namespace fsdpx
