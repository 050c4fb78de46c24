// Faulting an online resize's destinations in ahead (live_resize_prefault.h).
#include "launch/live_resize_prefault.h"

#include <algorithm>
#include <map>

#include "core/dtype.h"

namespace weft::launch {

std::vector<size_t> persistent_sizes(const planner::Plan& plan, int rank) {
  std::vector<size_t> sizes;
  for (const planner::TensorDesc& d : plan.program(rank).tensors)
    if (d.persistent && d.alias_of < 0)
      sizes.push_back(size_t(planner::box_numel(d.piece.box)) * core::dtype_size(d.dtype));
  return sizes;
}

std::vector<size_t> sizes_to_fault(const planner::Plan& plan, int rank, const HeldState& held) {
  std::map<size_t, size_t> kept;  // held tensors by size
  if (held.valid)
    for (const HeldPiece& p : held.pieces)
      for (const core::Tensor& t : p.tensors)
        if (t.defined()) ++kept[t.nbytes()];
  std::vector<size_t> sizes;
  for (size_t bytes : persistent_sizes(plan, rank)) {
    auto it = kept.find(bytes);
    if (it != kept.end() && it->second > 0) {
      --it->second;
      continue;
    }
    sizes.push_back(bytes);
  }
  return sizes;
}

size_t prefault_bound(int64_t held_bytes, const std::vector<size_t>& sizes, int64_t budget_bytes) {
  int64_t after = 0;
  for (size_t s : sizes) after += int64_t(s);
  const int64_t bound = std::max(held_bytes, after) + budget_bytes;
  return size_t(std::max<int64_t>(0, bound - held_bytes));
}

DestinationPrefault::~DestinationPrefault() { stop(); }

void DestinationPrefault::stop() {
  if (!thread_.joinable()) return;
  persistent_.reserve(sizes_, 0);  // a newer expectation: the thread stops after its block
  thread_.join();
}

void DestinationPrefault::start(std::vector<size_t> sizes, size_t max_bytes) {
  if (has_sizes_ && sizes == sizes_) return;
  stop();
  sizes_ = std::move(sizes);
  has_sizes_ = true;
  faulted_ = 0;
  thread_ = std::thread([this, max_bytes] {
    try {
      faulted_ = persistent_.reserve(sizes_, max_bytes);
    } catch (const std::exception&) {
      // No memory for it now: the trainer and the router allocate (and fail) themselves.
    }
  });
}

void DestinationPrefault::expect(std::vector<size_t> sizes) {
  if (has_sizes_ && sizes == sizes_) return;
  if (thread_.joinable()) {
    persistent_.reserve(sizes, 0);  // stops the thread; trims what `sizes` does not want
    thread_.join();
  } else {
    persistent_.reserve(sizes, 0);
  }
  sizes_ = std::move(sizes);
  has_sizes_ = true;
  faulted_ = 0;
}

size_t DestinationPrefault::trim() {
  stop();
  persistent_.trim();
  has_sizes_ = false;
  const size_t n = faulted_;
  faulted_ = 0;
  return n;
}

size_t DestinationPrefault::wait() {
  if (!thread_.joinable()) return 0;
  thread_.join();
  const size_t n = faulted_;
  faulted_ = 0;
  return n;
}

}  // namespace weft::launch
