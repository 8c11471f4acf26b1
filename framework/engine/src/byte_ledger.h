// The memory plan's count of the bytes alive during its replay of a step (memory_plan.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace fsdpx {

// Bytes alive now, and the largest moment since the last restart with where it was.
class Ledger {
 public:
  void add(int64_t bytes) { live_ += bytes; }
  void sub(int64_t bytes) { live_ -= bytes; }
  // A moment worth checking, with `extra` bytes alive on top for its duration.
  void moment(const std::string& where, int64_t extra = 0) {
    if (live_ + extra > peak_) {
      peak_ = live_ + extra;
      where_ = where;
    }
  }
  void restart() {
    peak_ = live_;
    where_.clear();
  }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  const std::string& where() const { return where_; }

 private:
  int64_t live_ = 0, peak_ = 0;
  std::string where_;
};

}  // namespace fsdpx
