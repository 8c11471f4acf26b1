// RowDigest: the per-tensor digest of fsdpx checkpoints.
#pragma once

#include <cstdint>
#include <string>

#include "fsdpx/export.h"

namespace fsdpx {

// How each row is hashed. Xxh3 (XXH3-64, libxxhash) is what fsdpx writes: it runs at memory
// speed. Fnv1a (byte-wise) is what checkpoints written before it hold; they still verify.
enum class DigestKind { Fnv1a, Xxh3 };

// A digest of a tensor that adds up over its dim-0 rows: the sum over rows i of
// mix(i, hash(row bytes)), kept as two 32-bit half sums so that partial sums from any split of
// the rows (any world size, any sharding) add to the same total without overflow.
struct FSDPX_API RowDigest {
  int64_t lo = 0, hi = 0;
  DigestKind kind = DigestKind::Xxh3;
  // Adds rows [first, first + count) given as `bytes` (count x row_bytes).
  void add_rows(const char* bytes, int64_t first, int64_t count, int64_t row_bytes);
  void add(const RowDigest& o) {
    lo += o.lo;
    hi += o.hi;
  }
  // Xxh3: "xxh3:" and 16 hex digits; Fnv1a: 16 hex digits (as the older checkpoints hold them).
  std::string hex() const;
  // The kind a recorded digest was made with (from its form above).
  static DigestKind kind_of(const std::string& recorded);
};

}  // namespace fsdpx
