// Files written so that they survive a crash once the call returns.
#pragma once

#include <cstddef>
#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

// All of `data` to `fd` (retrying short writes); throws fsdpx::Error naming `path`.
FSDPX_API void write_all(int fd, const char* data, size_t bytes, const std::string& path);
// `text` as the whole of file `path`, fsynced before it returns.
FSDPX_API void write_file_synced(const std::string& path, const std::string& text);

// fsync a directory (after a rename in it).
FSDPX_API void fsync_directory(const std::string& dir);

}  // namespace fsdpx
