// The counting CPU allocator's block cache (framework/runtime/src/cpu_block_cache.h), in this
// process through LibTorch's allocator: freed bytes serve later requests of other sizes (split),
// come back whole (merged), and go back to the system at the second trim that finds them unused.
#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include "fsdpx/framework/runtime/memory_accounting.h"

namespace fsdpx {
namespace {

constexpr int64_t MiB = int64_t{1} << 20;

at::Tensor bytes(int64_t n) { return at::empty({n}, at::kByte); }

// What the allocator holds from the system beyond `base`.
int64_t held_over(int64_t base) { return cpu_memory_stats().reserved - base; }

TEST(CpuBlockCache, FreedBytesServeOtherSizesAndGoBackWhenUnused) {
  install_cpu_memory_accounting();
  trim_cpu_block_cache();
  trim_cpu_block_cache();
  const int64_t base = cpu_memory_stats().reserved;
  bytes(8 * MiB);  // freed at once: its segment stays, whole and free
  const int64_t segment = held_over(base);
  EXPECT_GE(segment, 8 * MiB);
  EXPECT_LT(segment, 8 * MiB + MiB);
  {
    // Two blocks of another size out of the one freed: no new segment.
    at::Tensor a = bytes(3 * MiB), b = bytes(3 * MiB);
    EXPECT_EQ(held_over(base), segment);
    EXPECT_GE(cpu_memory_stats().allocated, 6 * MiB);
  }
  {
    // Freed, they merged back: the whole size fits again.
    at::Tensor c = bytes(8 * MiB);
    EXPECT_EQ(held_over(base), segment);
  }
  {
    // A request larger than any free block takes a segment of its own, and the free 8 MiB give
    // their pages back first: what is held resident grows by the 4 MiB more alone.
    at::Tensor d = bytes(12 * MiB);
    EXPECT_GE(held_over(base), 12 * MiB);
    EXPECT_LT(held_over(base), 12 * MiB + MiB);
    EXPECT_LT(cpu_memory_stats().peak_reserved - base, 12 * MiB + MiB);
  }
  {
    // The 8 MiB whose pages went back serve the next such request; the free 12 MiB give theirs back.
    at::Tensor e = bytes(8 * MiB);
    EXPECT_LT(held_over(base), 12 * MiB + MiB);
  }
  // Used since the last trim: kept by the next one, released by the one after.
  EXPECT_EQ(trim_cpu_block_cache(), 0);
  EXPECT_GE(trim_cpu_block_cache(), segment + 12 * MiB);
  EXPECT_EQ(held_over(base), 0);
}

// A block in use keeps its segment: only wholly free segments go.
TEST(CpuBlockCache, ASegmentWithABlockInUseStays) {
  install_cpu_memory_accounting();
  trim_cpu_block_cache();
  trim_cpu_block_cache();
  const int64_t base = cpu_memory_stats().reserved;
  bytes(8 * MiB);
  at::Tensor kept = bytes(2 * MiB);  // split out of the free 8 MiB
  const int64_t segment = held_over(base);
  trim_cpu_block_cache();
  EXPECT_EQ(trim_cpu_block_cache(), 0);
  EXPECT_EQ(held_over(base), segment);
  kept = at::Tensor();
  trim_cpu_block_cache();
  EXPECT_EQ(held_over(base), 0);
}

}  // namespace
}  // namespace fsdpx
