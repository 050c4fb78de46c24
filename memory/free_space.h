// FreeSpace: the free address ranges of one arena, indexed by offset (to take, give back
// and coalesce) and by size (for best fit). The planned allocator's online path uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace weft::memory {

// [lo, hi) ranges of an arena of `bytes`. Not thread-safe; callers serialise.
class FreeSpace {
 public:
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;  // sorted, disjoint
  static constexpr uint64_t kNone = UINT64_MAX;

  // Everything free.
  void reset(uint64_t bytes);
  bool is_free(uint64_t lo, uint64_t hi) const;
  // Marks [lo, hi) used; it must be free (InternalError otherwise).
  void take(uint64_t lo, uint64_t hi);
  // Marks [lo, hi) free again, merging with free neighbours; it must be in use.
  void give(uint64_t lo, uint64_t hi);
  // The lowest offset of `size` free bytes inside one of `allowed`, taken from the
  // smallest free range that has such a place (best fit); kNone when there is none.
  // Cost: O(log n) plus the free ranges of at least `size` bytes it has to pass over.
  uint64_t best_fit(uint64_t size, const Ranges& allowed) const;
  size_t num_ranges() const { return by_offset_.size(); }

 private:
  void insert(uint64_t lo, uint64_t hi);
  void erase(std::map<uint64_t, uint64_t>::iterator it);
  void resize(std::map<uint64_t, uint64_t>::iterator it, uint64_t lo, uint64_t hi);

  std::map<uint64_t, uint64_t> by_offset_;           // lo -> hi
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (hi - lo, lo)
};

}  // namespace weft::memory
