// FreeSpace: free ranges by offset and by size, with coalescing and windowed best fit.
#include "memory/free_space.h"

#include <algorithm>

#include "base/check.h"

namespace weft::memory {

void FreeSpace::reset(uint64_t bytes) {
  by_offset_.clear();
  by_size_.clear();
  if (bytes) insert(0, bytes);
}

void FreeSpace::insert(uint64_t lo, uint64_t hi) {
  by_offset_.emplace(lo, hi);
  by_size_.emplace(hi - lo, lo);
}

void FreeSpace::erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second - it->first, it->first});
  by_offset_.erase(it);
}

bool FreeSpace::is_free(uint64_t lo, uint64_t hi) const {
  auto it = by_offset_.upper_bound(lo);
  if (it == by_offset_.begin()) return false;
  --it;  // the free range starting at or before lo
  return it->second >= hi;
}

// take() and give() move and resize ranges by re-keying their nodes (extract and
// re-insert), so that the common cases allocate no memory: this is the planned
// allocator's hot path.
void FreeSpace::resize(std::map<uint64_t, uint64_t>::iterator it, uint64_t lo, uint64_t hi) {
  auto sized = by_size_.extract({it->second - it->first, it->first});
  sized.value() = {hi - lo, lo};
  by_size_.insert(std::move(sized));
  if (it->first == lo) {
    it->second = hi;
  } else {
    auto node = by_offset_.extract(it);
    node.key() = lo;
    node.mapped() = hi;
    by_offset_.insert(std::move(node));
  }
}

void FreeSpace::take(uint64_t lo, uint64_t hi) {
  auto it = by_offset_.upper_bound(lo);
  WEFT_CHECK(it != by_offset_.begin(), "FreeSpace::take of [", lo, ", ", hi, ") that is not free");
  --it;
  uint64_t a = it->first, b = it->second;
  WEFT_CHECK(b >= hi, "FreeSpace::take of [", lo, ", ", hi, ") that is not free");
  if (a == lo && hi == b) {
    erase(it);
  } else if (a == lo) {
    resize(it, hi, b);
  } else {
    resize(it, a, lo);
    if (hi < b) insert(hi, b);
  }
}

void FreeSpace::give(uint64_t lo, uint64_t hi) {
  auto next = by_offset_.lower_bound(lo);
  WEFT_CHECK(next == by_offset_.end() || next->first >= hi, "FreeSpace::give of a free range");
  bool joins_next = next != by_offset_.end() && next->first == hi;
  auto prev = next == by_offset_.begin() ? by_offset_.end() : std::prev(next);
  WEFT_CHECK(prev == by_offset_.end() || prev->second <= lo, "FreeSpace::give of a free range");
  bool joins_prev = prev != by_offset_.end() && prev->second == lo;
  if (joins_prev && joins_next) {
    uint64_t end = next->second;
    erase(next);
    resize(prev, prev->first, end);
  } else if (joins_prev) {
    resize(prev, prev->first, hi);
  } else if (joins_next) {
    resize(next, lo, next->second);
  } else {
    insert(lo, hi);
  }
}

uint64_t FreeSpace::best_fit(uint64_t size, const Ranges& allowed) const {
  for (auto it = by_size_.lower_bound({size, 0}); it != by_size_.end(); ++it) {
    uint64_t a = it->second, b = it->second + it->first;
    // The allowed ranges that overlap [a, b): from the first one ending after a.
    auto r = std::upper_bound(
        allowed.begin(), allowed.end(), a,
        [](uint64_t x, const std::pair<uint64_t, uint64_t>& rg) { return x < rg.second; });
    for (; r != allowed.end() && r->first < b; ++r) {
      uint64_t lo = std::max(a, r->first), hi = std::min(b, r->second);
      if (hi - lo >= size) return lo;
    }
  }
  return kNone;
}

}  // namespace weft::memory
