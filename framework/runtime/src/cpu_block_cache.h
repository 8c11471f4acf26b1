// The block cache of the counting CPU allocator (memory_accounting.cpp): large blocks that a step
// frees are kept and handed out again, so that their pages are not faulted in again every step,
// while what it holds resident stays within a few percent of the most it ever had in use.
//
// Blocks live in segments, one c10::alloc_cpu call each. A request takes the smallest free block
// that holds it (best fit); what it leaves over becomes a free block of its own when it is
// kMinBlock or more, as LibTorch's CUDA caching allocator splits its blocks; a freed block merges
// with the free blocks beside it in its segment. So what one phase of a step frees serves the next
// phase's requests whatever their sizes.
//
// Blocks in use split segments into free pieces that a later request may not fit
// (fragmentation), and a cache that kept them all would hold a third more than a step uses (gpt at
// 1b width). So the cache holds resident at most (1 + slack) times the most it ever had in use:
// before it grows beyond that, the free blocks freed longest ago give their pages back to the
// system (madvise MADV_DONTNEED: the addresses stay, a later take faults them in again). A step
// allocates the same as the last, so its pieces settle into the same places; while they have not
// (a step faulted pages in again that the cache had given back), the slack grows by kSlackStep, up
// to kSlackMost. On gpt at 1b width the pieces settle within two to four steps, 4 to 8% over.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>

namespace fsdpx {

class CpuBlockCache {
 public:
  // Requests of this many bytes and more are cached; smaller ones go to malloc, which keeps its own.
  static constexpr size_t kMinBlock = size_t{1} << 20;
  // Block sizes are multiples of it: whole pages, and the alignment the allocator's header keeps.
  static constexpr size_t kGranule = size_t{64} << 10;
  // The slack over the most in use, in percent: where it starts, its step, its most.
  static constexpr int kSlackStart = 4, kSlackStep = 2, kSlackMost = 25;

  struct Taken {
    char* base;    // kGranule-aligned within its segment, which is aligned as c10::alloc_cpu aligns
    size_t bytes;  // at least what was asked, under kMinBlock more
    void* block;   // for give_back
  };
  // A block of at least `bytes` (kMinBlock or more). Throws c10::Error when the system has no memory.
  Taken take(size_t bytes);
  // The block of a take(), free again. Thread-safe, as take() is.
  void give_back(void* block);
  // Once a step: releases the segments wholly free that no take() used since the previous trim,
  // and returns their bytes; widens the slack when the step faulted given-back pages in again.
  int64_t trim();
  // The bytes of every segment held, less the free bytes whose pages went back: what the cache
  // holds resident once the blocks in use are touched.
  int64_t resident_bytes() const { return resident_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Segment;
  enum class State { InUse, Free, Released };  // Released: free, its pages given back
  struct Block {
    char* base;
    size_t bytes;
    Segment* segment;
    Block* prev = nullptr;  // the blocks beside it in its segment, by address
    Block* next = nullptr;
    State state = State::InUse;
    uint64_t freed_at = 0;  // when a caller last gave it back; 0 for what a split left over
  };
  struct Segment {
    char* base;
    size_t bytes;
    uint64_t used_in;  // the trim epoch of its last take()
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->bytes != b->bytes ? a->bytes < b->bytes : a->base < b->base;
    }
  };
  struct ByAge {
    bool operator()(const Block* a, const Block* b) const {
      return a->freed_at != b->freed_at ? a->freed_at < b->freed_at : a->base < b->base;
    }
  };
  using Index = std::set<Block*, BySize>;
  // With mu_ held: a block into the index of a free state (merged with its neighbours of that
  // state, the result freed at `freed_at`) and out of it; a free block cut to `bytes` (the rest a
  // block of the same state); the given-back pages of free blocks, the oldest first, until `bytes`.
  Index& index(State s) { return s == State::Free ? free_ : released_; }
  void insert(Block* b, State s, uint64_t freed_at);
  void erase(Block* b);
  void cut(Block* b, size_t bytes);
  void release_pages(int64_t bytes);
  Taken taken(Block* b);

  mutable std::mutex mu_;
  Index free_, released_;
  std::set<Block*, ByAge> free_by_age_;
  uint64_t epoch_ = 0, clock_ = 0;
  int64_t in_use_ = 0, most_in_use_ = 0, faulted_again_ = 0;
  int slack_ = kSlackStart;
  std::atomic<int64_t> resident_bytes_{0};
};

// The process's cache (never destroyed: blocks may be freed at exit).
CpuBlockCache& cpu_block_cache();

}  // namespace fsdpx
