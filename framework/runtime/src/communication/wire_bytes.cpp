// Bytes this process has put on TCP connections, read from the kernel (TCP_INFO).
#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <string>

#include "fsdpx/framework/runtime/communicator.h"

namespace fsdpx {

int64_t tcp_bytes_sent() {
  int64_t total = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return -1;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || fd == ::dirfd(dir)) continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int type = 0;
    socklen_t len = sizeof type;
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    struct tcp_info info {};
    len = sizeof info;
    if (::getsockopt(static_cast<int>(fd), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;  // not TCP
    if (len < offsetof(struct tcp_info, tcpi_bytes_retrans) + sizeof info.tcpi_bytes_retrans) continue;
    // Retransmissions (spurious ones happen on a starved machine) are not traffic the program
    // asked for: count each byte once.
    total += static_cast<int64_t>(info.tcpi_bytes_sent) - static_cast<int64_t>(info.tcpi_bytes_retrans);
  }
  ::closedir(dir);
  return total;
}

}  // namespace fsdpx
