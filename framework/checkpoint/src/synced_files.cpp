#include "fsdpx/framework/checkpoint/synced_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fsdpx/error.h"

namespace fsdpx {

void write_all(int fd, const char* data, size_t bytes, const std::string& path) {
  while (bytes > 0) {
    const ssize_t w = ::write(fd, data, bytes);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error(path + ": write failed: " + std::strerror(errno));
    data += w;
    bytes -= static_cast<size_t>(w);
  }
}

void write_file_synced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path + ": cannot be written: " + std::strerror(errno));
  try {
    write_all(fd, text.data(), text.size(), path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) throw Error(path + ": fsync failed: " + std::strerror(errno));
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace fsdpx
