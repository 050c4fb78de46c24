// PointerMap: the allocators' map from a block's pointer to its bookkeeping. It recycles
// its hash nodes, so that allocating and freeing do not call malloc for bookkeeping.
#pragma once

#include <unordered_map>
#include <utility>
#include <vector>

namespace weft::memory {

// Not thread-safe; the owning allocator's lock covers it. Holds at most as many spare
// nodes as it once held entries.
template <typename V>
class PointerMap {
 public:
  using Map = std::unordered_map<const void*, V>;
  using iterator = typename Map::iterator;
  using const_iterator = typename Map::const_iterator;

  // `p` must not be present.
  void insert(const void* p, V v) {
    if (spare_.empty()) {
      map_.emplace(p, std::move(v));
      return;
    }
    auto node = std::move(spare_.back());
    spare_.pop_back();
    node.key() = p;
    node.mapped() = std::move(v);
    map_.insert(std::move(node));
  }
  iterator find(const void* p) { return map_.find(p); }
  const_iterator find(const void* p) const { return map_.find(p); }
  bool contains(const void* p) const { return map_.count(p) != 0; }
  void erase(iterator it) { spare_.push_back(map_.extract(it)); }
  iterator begin() { return map_.begin(); }
  iterator end() { return map_.end(); }
  const_iterator end() const { return map_.end(); }
  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }

 private:
  Map map_;
  std::vector<typename Map::node_type> spare_;
};

}  // namespace weft::memory
