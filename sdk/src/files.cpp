#include "fsdpx/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "fsdpx/error.h"

namespace fsdpx {

std::string file_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ELOOP) return kSymlinkLoop;
    return errno == ENOENT || errno == ENOTDIR ? "missing" : "unreadable";
  }
  switch (st.st_mode & S_IFMT) {
    case S_IFREG: return "";
    case S_IFDIR: return "a directory";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    default: return "not a regular file";
  }
}

uint64_t check_input_file(const std::string& path, const std::string& what) {
  const std::string where = what + " " + path;
  if (path.empty()) throw Error(what + " is empty; give a file");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) throw Error(where + " does not exist");
    if (errno == ELOOP) throw Error(where + " is " + kSymlinkLoop + "; point " + what + " at a file");
    throw Error(where + " cannot be read: " + std::strerror(errno));
  }
  const std::string kind = file_kind(path);
  if (kind == "a directory") throw Error(where + " is a directory; give a file");
  if (!kind.empty()) throw Error(where + " is " + kind + ", not a regular file");
  // Opening a regular file never blocks; this finds what permissions forbid.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(where + " cannot be read: " + std::strerror(errno));
  ::close(fd);
  return static_cast<uint64_t>(st.st_size);
}

void check_fits_in_memory(uint64_t bytes, const std::string& what, const std::string& advice) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (meminfo >> key >> kib && key != "MemAvailable:") meminfo.ignore(256, '\n');
  if (key != "MemAvailable:" || bytes <= (kib << 10)) return;
  auto gib = [](uint64_t b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(b) / (1 << 30));
    return std::string(text);
  };
  throw Error(what + " needs " + gib(bytes) + " of memory, and this machine has " + gib(kib << 10) + " available; " +
              advice);
}

}  // namespace fsdpx
