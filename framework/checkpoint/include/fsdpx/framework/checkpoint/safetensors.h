// safetensors files (the Hugging Face format: an 8-byte little-endian header length, a JSON
// header of {name: {dtype, shape, data_offsets}} and "__metadata__", then raw little-endian
// data), read by byte range with every size and offset checked, and a row-decomposable digest.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdpx/export.h"
#include "fsdpx/framework/checkpoint/row_digest.h"
#include "fsdpx/framework/checkpoint/synced_files.h"

namespace fsdpx {

// "F32", "BF16", ... for a LibTorch dtype, and back. Throws fsdpx::Error for one safetensors
// cannot hold or a name it does not define.
FSDPX_API std::string safetensors_dtype(c10::ScalarType t);
FSDPX_API c10::ScalarType dtype_from_safetensors(const std::string& name);

struct SafetensorsEntry {
  std::string dtype;
  c10::ScalarType scalar_type;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  int64_t row_bytes() const;   // bytes of one dim-0 row (the whole tensor for a scalar)
};

// Reads a file's header and entries; tensor data is read on demand by byte range. Every check a
// hostile file could fail gives fsdpx::Error naming the file: header length beyond the file,
// JSON that is not an object of entries, unknown dtype, offsets outside the data section or not
// matching shape x dtype, overlapping entries.
class FSDPX_API SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry& entry(const std::string& name) const;
  // Rows [first, first + count) of tensor `name` as raw bytes.
  std::vector<char> read_rows(const std::string& name, int64_t first, int64_t count);
  // The same into `out` (count x row_bytes), e.g. straight into the tensor that receives them.
  void read_rows_into(const std::string& name, int64_t first, int64_t count, char* out);
  // The whole tensor (for tools and tests).
  at::Tensor read(const std::string& name);
  int64_t file_size() const { return file_size_; }

 private:
  std::string path_;
  std::ifstream in_;
  int64_t file_size_ = 0, data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors one at a time after a header computed from their names, dtypes and shapes,
// so that a file larger than memory streams through one tensor.
class FSDPX_API SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    c10::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  // Writes the header; then write() must be called once per spec, in order.
  SafetensorsWriter(const std::string& path, const std::vector<Spec>& specs,
                    const std::map<std::string, std::string>& metadata);
  // Without a successful close() (an error path), the incomplete file is removed.
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  void write(const at::Tensor& tensor);
  // The next `bytes` bytes of the data, in declaration order: a tensor may come in several parts
  // (rows staged a buffer at a time), and one part never spans two tensors. The caller lays them
  // out as the declared dtype, contiguous.
  void write_part(const void* data, int64_t bytes);
  // Flushes and fsyncs; throws if anything failed or a tensor is missing.
  void close();

 private:
  std::string path_;
  std::vector<Spec> specs_;
  size_t next_ = 0;
  int64_t part_done_ = 0;  // bytes of specs_[next_] written by write_part so far
  int fd_ = -1;
};

}  // namespace fsdpx
