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

std::vector<size_t> held_sizes(const HeldState& held) {
  std::vector<size_t> sizes;
  if (held.valid)
    for (const HeldPiece& p : held.pieces)
      for (const core::Tensor& t : p.tensors)
        if (t.defined()) sizes.push_back(t.nbytes());
  return sizes;
}

std::vector<size_t> sizes_to_fault(const planner::Plan& plan, int rank, const HeldState& held) {
  return sizes_to_fault(plan, rank, held_sizes(held));
}

std::vector<size_t> sizes_to_fault(const planner::Plan& plan, int rank,
                                   const std::vector<size_t>& held) {
  std::map<size_t, size_t> kept;  // held tensors by size
  for (size_t bytes : held) ++kept[bytes];
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
  return prefault_bound(held_bytes, sizes, budget_bytes, held_bytes);
}

size_t prefault_bound(int64_t held_bytes, const std::vector<size_t>& sizes, int64_t budget_bytes,
                      int64_t holding_bytes) {
  int64_t after = 0;
  for (size_t s : sizes) after += int64_t(s);
  const int64_t bound = std::max(held_bytes, after) + budget_bytes;
  return size_t(std::max<int64_t>(0, bound - std::max(held_bytes, holding_bytes)));
}

DestinationPrefault::~DestinationPrefault() { stop(); }

void DestinationPrefault::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ran_under_ = max_;  // no further pass
  }
  persistent_.reserve(sizes_, 0);  // a newer expectation: the thread stops after its block
  thread_.join();
}

void DestinationPrefault::start(std::vector<size_t> sizes, size_t max_bytes,
                                std::vector<size_t> returning) {
  if (has_sizes_ && sizes == sizes_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (max_bytes <= max_) return;
      max_ = max_bytes;
      if (running_) return;  // it takes the larger bound after its pass
    }
    if (thread_.joinable()) thread_.join();  // done under the smaller one
    launch();
    return;
  }
  stop();
  sizes_ = std::move(sizes);
  returning_ = std::move(returning);
  has_sizes_ = true;
  faulted_ = reported_ = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    max_ = max_bytes;
    ran_under_ = 0;
  }
  launch();
}

void DestinationPrefault::launch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = true;
  }
  thread_ = std::thread([this] {
    for (;;) {
      size_t bound = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (max_ <= ran_under_) {
          running_ = false;
          return;
        }
        bound = ran_under_ = max_;
      }
      // A later pass counts what the earlier ones faulted in against the bound: the
      // reserve's blocks are all new memory beside what the rank holds.
      try {
        faulted_ += persistent_.reserve(sizes_, bound - std::min(bound, faulted_), returning_);
        returning_.clear();
      } catch (const std::exception&) {
        // No memory for it now: the trainer and the router allocate (and fail) themselves.
        std::lock_guard<std::mutex> lock(mu_);
        running_ = false;
        return;
      }
    }
  });
}

size_t DestinationPrefault::max_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return has_sizes_ ? max_ : 0;
}

void DestinationPrefault::expect(std::vector<size_t> sizes) {
  if (has_sizes_ && sizes == sizes_) return;
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ran_under_ = max_;  // no further pass
    }
    persistent_.reserve(sizes, 0);  // stops the thread; trims what `sizes` does not want
    thread_.join();
  } else {
    persistent_.reserve(sizes, 0);
  }
  sizes_ = std::move(sizes);
  has_sizes_ = true;
  faulted_ = reported_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  max_ = ran_under_ = 0;
}

size_t DestinationPrefault::trim() {
  stop();
  persistent_.trim();
  has_sizes_ = false;
  const size_t n = faulted_;
  faulted_ = reported_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  max_ = ran_under_ = 0;
  return n;
}

size_t DestinationPrefault::wait() {
  if (!thread_.joinable()) return 0;
  thread_.join();
  const size_t n = faulted_ - reported_;
  reported_ = faulted_;
  return n;
}

}  // namespace weft::launch
