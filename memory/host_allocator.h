// A plain aligned host allocator with statistics: the simplest Allocator, and the
// default for tensors that no arena owns.
#pragma once

#include <mutex>
#include <unordered_map>

#include "memory/allocator.h"

namespace weft::memory {

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, Tag tag = Tag::kOther) override;
  void free(void* ptr) override;
  AllocatorStats stats() const override;
  std::string name() const override { return "host"; }

 private:
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  AllocatorStats stats_;
};

}  // namespace weft::memory
