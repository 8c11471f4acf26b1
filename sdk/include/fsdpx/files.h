// fsdpx/files.h: checks on the files a user names, before they are read.
#pragma once

#include <cstdint>
#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

// Checks an input file that `what` names in messages ("data.path", "--config"): it exists, is a
// regular file (symlinks followed; not a directory, a device, a FIFO or a socket, which could be
// read forever or block), and can be opened for reading. Returns its size in bytes. Throws
// fsdpx::Error naming the file and what it is instead.
FSDPX_API uint64_t check_input_file(const std::string& path, const std::string& what);

// Refuses holding `bytes` read from `what` in memory when this machine has less available (Linux's
// MemAvailable): one line with both sizes and `advice`, instead of the out-of-memory killer ending
// the process without a word. Passes where the available memory is unknown.
FSDPX_API void check_fits_in_memory(uint64_t bytes, const std::string& what, const std::string& advice);

// "a directory", "a character device", "a FIFO", ... for what `path` is (symlinks followed);
// "" when it is a regular file, "missing" when there is nothing, kSymlinkLoop when following its
// symbolic links never ends, "unreadable" when a directory on the way forbids looking.
FSDPX_API std::string file_kind(const std::string& path);
inline constexpr const char* kSymlinkLoop = "a loop of symbolic links (following them never reaches a file)";

}  // namespace fsdpx
