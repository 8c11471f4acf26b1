// RowDigest: a digest that adds up over a tensor's rows, so any split of the rows (any world
// size, any sharding) sums to the same value.
#include "fsdpx/framework/checkpoint/row_digest.h"

#include <cstdio>

#define XXH_INLINE_ALL  // header-only: libxxhash-dev's xxhash.h, no library to ship with fsdpx
#include <xxhash.h>

namespace fsdpx {

namespace {
constexpr const char* kXxh3Prefix = "xxh3:";

uint64_t fnv1a(const char* p, int64_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (int64_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ULL;
  }
  return h;
}
uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

void RowDigest::add_rows(const char* bytes, int64_t first, int64_t count, int64_t row_bytes) {
  for (int64_t r = 0; r < count; ++r) {
    const char* row = bytes + r * row_bytes;
    const uint64_t content =
        kind == DigestKind::Xxh3 ? XXH3_64bits(row, static_cast<size_t>(row_bytes)) : fnv1a(row, row_bytes);
    const uint64_t h = splitmix(content ^ splitmix(static_cast<uint64_t>(first + r)));
    lo += static_cast<int64_t>(h & 0xffffffffULL);
    hi += static_cast<int64_t>(h >> 32);
  }
}

std::string RowDigest::hex() const {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) ^ static_cast<uint64_t>(lo) ^ (static_cast<uint64_t>(hi) >> 32);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(splitmix(v)));
  return kind == DigestKind::Xxh3 ? kXxh3Prefix + std::string(buf) : std::string(buf);
}

DigestKind RowDigest::kind_of(const std::string& recorded) {
  return recorded.rfind(kXxh3Prefix, 0) == 0 || recorded.empty() ? DigestKind::Xxh3 : DigestKind::Fnv1a;
}

}  // namespace fsdpx
