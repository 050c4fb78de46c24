// In-memory snapshots, the zero-copy read (snapshot_views.h).
#include "checkpoint/snapshot_views.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "base/check.h"
#include "base/error.h"
#include "base/populate.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/split_in_two.h"
#include "checkpoint/snapshot_writer.h"

namespace weft::checkpoint {
namespace {

// The live views' byte ranges, [begin, end) by begin, with how many views start there (a
// slot read twice while its first views live): is_snapshot_view looks a tensor up here (a
// Tensor does not say which allocator its storage came from).
std::mutex g_mu;
std::map<uintptr_t, std::pair<uintptr_t, int>> g_views;

// Serves one view tensor: allocate() hands out its place in the mapped slot (once), free()
// forgets it and deletes this allocator, which kept the segment mapped meanwhile.
class ViewAllocator final : public memory::Allocator {
 public:
  ViewAllocator(std::shared_ptr<const SnapshotSegment> segment, const uint8_t* at, size_t bytes)
      : segment_(std::move(segment)), at_(at), bytes_(bytes) {}
  void* allocate(size_t bytes, memory::Tag) override {
    WEFT_CHECK(bytes == bytes_ && !handed_, "a snapshot view serves its own ", bytes_,
               " bytes once (asked for ", bytes, ")");
    handed_ = true;
    std::lock_guard<std::mutex> l(g_mu);
    auto& [end, count] = g_views[uintptr_t(at_)];
    end = std::max(end, uintptr_t(at_) + bytes_);
    count++;
    return const_cast<uint8_t*>(at_);  // often a read-only mapping: the router only reads it
  }
  void free(void*) override {
    {
      std::lock_guard<std::mutex> l(g_mu);
      auto it = g_views.find(uintptr_t(at_));
      if (it != g_views.end() && --it->second.second == 0) g_views.erase(it);
    }
    delete this;
  }
  memory::AllocatorStats stats() const override { return {}; }
  std::string name() const override { return "snapshot view"; }

 private:
  std::shared_ptr<const SnapshotSegment> segment_;
  const uint8_t* at_;
  size_t bytes_;
  bool handed_ = false;
};

}  // namespace

void populate_for_write(void* p, int64_t bytes) {
  constexpr int64_t kAtLeast = int64_t(1) << 20;
  if (bytes >= kAtLeast) (void)populate_pages(p, size_t(bytes), PageAccess::kWrite);
}

void check_slot_layout(const SnapshotSegment& segment, const SnapshotSegment::View& view,
                       const parallel::RankLayout& layout) {
  const std::string& name = segment.name();
  if (view.meta.layout_hash != snapshot_layout_hash(layout))
    throw IoError(name + ": the snapshot holds other boxes than rank " +
                  std::to_string(view.meta.rank) + " of a world of " +
                  std::to_string(view.meta.world) + " has in this job's plan");
  if (view.meta.payload_bytes != snapshot_payload_bytes(layout))
    throw IoError(name + ": the snapshot holds " + std::to_string(view.meta.payload_bytes) +
                  " bytes, the rank's layout " + std::to_string(snapshot_payload_bytes(layout)));
}

void check_slot_read(const SnapshotSegment& segment, const SnapshotSegment::View& view,
                     const std::vector<uint32_t>& crcs, const std::vector<uint32_t>& recorded) {
  const std::string& name = segment.name();
  int64_t bad = 0, first = -1;
  for (size_t b = 0; b < crcs.size(); ++b)
    if (crcs[b] != recorded[b]) bad++, first = first < 0 ? int64_t(b) : first;
  if (crcs.size() != recorded.size() || bad)
    throw IoError(name + ": " + std::to_string(bad) + " corrupt block(s) of " +
                  std::to_string(kSnapshotBlockBytes) + " bytes, the first at byte " +
                  std::to_string(first * kSnapshotBlockBytes) + " of step " +
                  std::to_string(view.meta.step) + "'s snapshot");
  if (segment.sequence(view.slot) != view.meta.sequence)
    throw IoError(name + ": the snapshot of step " + std::to_string(view.meta.step) +
                  " was rewritten while it was read");
}

std::vector<core::Tensor> view_snapshot(std::shared_ptr<const SnapshotSegment> segment,
                                        const SnapshotSegment::View& view,
                                        const parallel::RankLayout& layout) {
  check_slot_layout(*segment, view, layout);
  const int64_t total = snapshot_payload_bytes(layout);
  // Every block checked in place, each by one thread.
  const std::vector<uint32_t> recorded = segment->block_crc32c(view);
  std::vector<uint32_t> crcs(recorded.size(), 0);
  const auto* src = static_cast<const uint8_t*>(view.payload);
  split_in_two(total, kSnapshotBlockBytes, [&](int64_t from, int64_t to) {
    for (int64_t at = from; at < to; at += kSnapshotBlockBytes) {
      const size_t block = size_t(at / kSnapshotBlockBytes);
      if (block < crcs.size())
        crcs[block] = crc32c(src + at, size_t(std::min(kSnapshotBlockBytes, to - at)));
    }
  });
  check_slot_read(*segment, view, crcs, recorded);
  std::vector<core::Tensor> out;
  out.reserve(layout.locals.size());
  int64_t at = 0;
  for (const parallel::LocalTensor& l : layout.locals) {
    // Owned by its tensor's storage, which frees (deletes) it with the tensor.
    auto* alloc = new ViewAllocator(segment, src + at, size_t(l.bytes()));
    out.push_back(core::Tensor::empty_on(core::Device::cpu(), l.shape, l.dtype, *alloc));
    at += l.bytes();
  }
  return out;
}

bool is_snapshot_view(const core::Tensor& t) {
  if (!t.defined()) return false;
  const uintptr_t p = reinterpret_cast<uintptr_t>(t.raw_data());
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_views.upper_bound(p);
  return it != g_views.begin() && p < std::prev(it)->second.first;
}

int64_t own_snapshot_views(std::vector<core::Tensor>& tensors, memory::Allocator* alloc) {
  struct Copy {
    const uint8_t* src;
    uint8_t* dst;
    int64_t n;
  };
  std::vector<Copy> copies;
  std::vector<core::Tensor> views;  // kept until copied: they keep their segment mapped
  int64_t total = 0;
  for (core::Tensor& t : tensors) {
    if (!is_snapshot_view(t)) continue;
    WEFT_CHECK(t.is_contiguous(), "a snapshot view is a whole contiguous tensor");
    core::Tensor c = core::Tensor::empty(t.shape(), t.dtype(), alloc);
    copies.push_back({static_cast<const uint8_t*>(t.raw_data()), static_cast<uint8_t*>(c.raw_data()),
                      int64_t(t.nbytes())});
    total += int64_t(t.nbytes());
    views.push_back(std::exchange(t, std::move(c)));
  }
  // Payload bytes [from, to) of the copies laid end to end; the destination's pages are
  // mapped in just before they are written.
  split_in_two(total, 1, [&](int64_t from, int64_t to) {
    int64_t at = 0;
    for (const Copy& c : copies) {
      const int64_t lo = std::max(at, from), hi = std::min(at + c.n, to);
      if (lo < hi) {
        populate_for_write(c.dst + (lo - at), hi - lo);
        std::memcpy(c.dst + (lo - at), c.src + (lo - at), size_t(hi - lo));
      }
      at += c.n;
    }
  });
  return total;
}

}  // namespace weft::checkpoint
