#include "cpu_block_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <c10/core/impl/alloc_cpu.h>

namespace fsdpx {
namespace {

// The pages wholly inside [base, base + bytes) go back to the system; the addresses stay valid and
// read as zeros until touched again.
void give_pages_back(char* base, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t from = (reinterpret_cast<uintptr_t>(base) + page - 1) / page * page,
                  to = (reinterpret_cast<uintptr_t>(base) + bytes) / page * page;
  if (to > from) ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);  // advice: no error to act on
}

}  // namespace

void CpuBlockCache::insert(Block* b, State s, uint64_t freed_at) {
  // Free pieces of one state beside each other become one block.
  if (Block* p = b->prev; p && p->state == s) {
    erase(p);
    p->bytes += b->bytes;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  if (Block* n = b->next; n && n->state == s) {
    erase(n);
    b->bytes += n->bytes;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  b->state = s;
  b->freed_at = freed_at;
  index(s).insert(b);
  if (s == State::Free) free_by_age_.insert(b);
}

void CpuBlockCache::erase(Block* b) {
  index(b->state).erase(b);
  if (b->state == State::Free) free_by_age_.erase(b);
  b->state = State::InUse;
}

void CpuBlockCache::cut(Block* b, size_t bytes) {
  const State s = b->state;
  erase(b);
  if (b->bytes - bytes >= kMinBlock) {  // the rest stays as it was, beside it
    Block* rest = new Block{b->base + bytes, b->bytes - bytes, b->segment, b, b->next};
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->bytes = bytes;
    insert(rest, s, 0);
  }
}

void CpuBlockCache::release_pages(int64_t bytes) {
  while (bytes > 0 && !free_by_age_.empty()) {
    Block* b = *free_by_age_.begin();
    erase(b);
    bytes -= static_cast<int64_t>(b->bytes);
    resident_bytes_.fetch_sub(static_cast<int64_t>(b->bytes), std::memory_order_relaxed);
    give_pages_back(b->base, b->bytes);
    insert(b, State::Released, 0);
  }
}

CpuBlockCache::Taken CpuBlockCache::taken(Block* b) {
  b->segment->used_in = epoch_;
  in_use_ += static_cast<int64_t>(b->bytes);
  most_in_use_ = std::max(most_in_use_, in_use_);
  return {b->base, b->bytes, b};
}

CpuBlockCache::Taken CpuBlockCache::take(size_t bytes) {
  const size_t want = (bytes + kGranule - 1) / kGranule * kGranule;
  {
    std::lock_guard<std::mutex> g(mu_);
    Block probe{nullptr, want, nullptr};
    if (auto it = free_.lower_bound(&probe); it != free_.end()) {  // the smallest free block that holds it
      Block* b = *it;
      cut(b, want);
      return taken(b);
    }
    // Resident bytes grow by `want`: beyond the slack over the most in use, as many free bytes
    // give their pages back first.
    const int64_t most = std::max(most_in_use_, in_use_ + static_cast<int64_t>(want));
    release_pages(resident_bytes() + static_cast<int64_t>(want) - most - most * slack_ / 100);
    // The smallest block whose pages went back that holds it: they fault in again.
    if (auto it = released_.lower_bound(&probe); it != released_.end()) {
      Block* b = *it;
      cut(b, want);
      resident_bytes_.fetch_add(static_cast<int64_t>(b->bytes), std::memory_order_relaxed);
      faulted_again_ += static_cast<int64_t>(b->bytes);
      return taken(b);
    }
  }
  // None holds it: a segment of its own.
  char* base = static_cast<char*>(c10::alloc_cpu(want));  // throws c10::Error when out of memory
  std::lock_guard<std::mutex> g(mu_);
  resident_bytes_.fetch_add(static_cast<int64_t>(want), std::memory_order_relaxed);
  return taken(new Block{base, want, new Segment{base, want, epoch_}});
}

void CpuBlockCache::give_back(void* block) {
  auto* b = static_cast<Block*>(block);
  std::lock_guard<std::mutex> g(mu_);
  in_use_ -= static_cast<int64_t>(b->bytes);
  insert(b, State::Free, ++clock_);
}

int64_t CpuBlockCache::trim() {
  std::vector<char*> gone;
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    // Pages given back and faulted in again within a step (more than 1% of the most in use): the
    // step's pieces have not settled within the slack; widen it.
    if (faulted_again_ > most_in_use_ / 100) slack_ = std::min(kSlackMost, slack_ + kSlackStep);
    faulted_again_ = 0;
    for (State s : {State::Free, State::Released}) {
      Index& free = index(s);
      for (auto it = free.begin(); it != free.end();) {
        Block* b = *it;
        // Merged back into one block (the segment is free), and no take() since the last trim.
        if (b->prev || b->next || b->segment->used_in >= epoch_) {
          ++it;
          continue;
        }
        it = free.erase(it);
        if (s == State::Free) {
          free_by_age_.erase(b);
          resident_bytes_.fetch_sub(static_cast<int64_t>(b->bytes), std::memory_order_relaxed);
        }
        gone.push_back(b->segment->base);
        bytes += static_cast<int64_t>(b->bytes);
        delete b->segment;
        delete b;
      }
    }
    ++epoch_;
  }
  for (char* base : gone) c10::free_cpu(base);
  return bytes;
}

CpuBlockCache& cpu_block_cache() {
  static auto* c = new CpuBlockCache();  // leaked: blocks may be freed at exit
  return *c;
}

}  // namespace fsdpx
