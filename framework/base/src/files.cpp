#include "fsdpx/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fsdpx/error.h"

namespace fsdpx {

std::string file_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT || errno == ENOTDIR ? "missing" : "unreadable";
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

}  // namespace fsdpx
