// PlannedAllocator: plan lookup by allocation order, online best-fit in the plan's idle
// windows, fallback pool, and arena retirement across replans.
#include "memory/planned_allocator.h"

#include <algorithm>
#include <new>

#include "base/check.h"
#include "base/log.h"

namespace weft::memory {

PlannedAllocator::PlannedAllocator(const Trace& trace, PlannedOptions options,
                                   SegmentSource* arena_source, SegmentSource* fallback_source)
    : PlannedAllocator(trace, plan_offline(trace, options.planner), options, arena_source,
                       fallback_source) {}

PlannedAllocator::PlannedAllocator(const Trace& trace, Plan plan, PlannedOptions options,
                                   SegmentSource* arena_source, SegmentSource* fallback_source)
    : options_(options),
      arena_source_(arena_source ? arena_source : &default_host_segment_source()),
      fallback_(options.fallback, fallback_source) {
  PlanCheck check = check_plan(trace, plan);
  WEFT_CHECK(check.ok,
             "PlannedAllocator given a plan that does not fit its trace: ", check.message);
  arena_ = reserve_arena(plan.arena_bytes);
  install(trace, std::move(plan));
  note_reserved();
}

PlannedAllocator::~PlannedAllocator() {
  if (!blocks_.empty())
    WEFT_WARN("memory", "planned allocator destroyed with ", blocks_.size(), " live blocks");
  if (arena_.base) arena_source_->release(arena_.base, arena_.bytes);
  for (auto& [id, a] : retired_) arena_source_->release(a.base, a.bytes);
}

PlannedAllocator::Arena PlannedAllocator::reserve_arena(uint64_t bytes) {
  Arena a;
  if (bytes == 0) return a;
  a.bytes = block_size(bytes, SegmentSource::kSegmentAlignment);
  a.base = static_cast<char*>(arena_source_->reserve(a.bytes));
  if (!a.base) throw std::bad_alloc();
  return a;
}

void PlannedAllocator::install(const Trace& trace, Plan plan) {
  plan_ = std::move(plan);
  slots_.clear();
  slots_.reserve(trace.records.size());
  for (size_t k = 0; k < trace.records.size(); ++k) {
    const TraceRecord& r = trace.records[k];
    int32_t g = plan_.group_of.empty() ? -1 : plan_.group_of[k];
    slots_.push_back({plan_.offsets[k], plan_.sizes[k], r.alloc_event, trace.end_of(r), r.tag, g});
  }
  groups_.clear();
  for (const PlanGroup& g : plan_.groups) groups_.push_back({g.offset, g.bytes});
  used_in_step_.assign(slots_.size(), 0);
  cursor_ = 0;
  span_ = 0;
  span_used_ = span_jump_ = false;
  span_first_.clear();
  int32_t last_span = trace.records.empty() ? 0 : trace.records.back().alloc_span;
  if (last_span > 0) {  // a trace without phases gives no anchors
    for (size_t k = 0; k < trace.records.size(); ++k)
      while (int32_t(span_first_.size()) <= trace.records[k].alloc_span) span_first_.push_back(k);
  }
  free_.reset(arena_.bytes);
  spare_cache_.clear();
  planned_stats_.arena_bytes = arena_.bytes;
}

void PlannedAllocator::replan(const Trace& trace) {
  replan(trace, plan_offline(trace, options_.planner));
}

void PlannedAllocator::replan(const Trace& trace, Plan plan) {
  PlanCheck check = check_plan(trace, plan);
  WEFT_CHECK(check.ok, "replan with a plan that does not fit its trace: ", check.message);
  Arena fresh = reserve_arena(plan.arena_bytes);  // may throw; nothing has changed yet
  std::lock_guard<std::mutex> lock(mu_);
  if (arena_.live > 0) {
    // Blocks of the old arena stay where they are until freed.
    uint32_t id = next_retired_id_++;
    for (auto& [ptr, b] : blocks_) {
      if (b.where != Where::kArena) continue;
      b.where = Where::kRetired;
      b.arena = id;
    }
    retired_.emplace(id, arena_);
    planned_stats_.retired_arena_bytes += arena_.bytes;
  } else if (arena_.base) {
    arena_source_->release(arena_.base, arena_.bytes);
  }
  arena_ = fresh;
  install(trace, std::move(plan));
  planned_stats_.replans++;
  note_reserved();
}

void PlannedAllocator::begin_step() {
  std::lock_guard<std::mutex> lock(mu_);
  ++step_;
  cursor_ = 0;
  span_ = 0;
  span_used_ = span_jump_ = false;
}

void PlannedAllocator::set_phase(Phase, int) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!span_used_) return;  // an empty span is merged into the next, as in TraceBuilder
  ++span_;
  span_used_ = false;
  span_jump_ = true;
}

PlannedAllocator::Match PlannedAllocator::match(uint64_t size, Tag tag) {
  size_t n = slots_.size();
  if (span_jump_ && !span_first_.empty())
    cursor_ = size_t(span_) < span_first_.size() ? span_first_[size_t(span_)] : n;
  span_jump_ = false;
  size_t c = cursor_;
  auto unused = [&](size_t j) { return used_in_step_[j] != step_ && slots_[j].tag == tag; };
  if (c < n && unused(c)) {
    cursor_ = c + 1;
    if (size <= slots_[c].size) {
      used_in_step_[c] = step_;
      return {c, c, false};
    }
    // The expected allocation, grown: it may use its own range and what is idle around it.
    return {kNone, c, true};
  }
  // The sequence shifted: resynchronise on the nearest record of this size and tag.
  size_t reach = std::max(options_.match_ahead, options_.match_behind);
  for (size_t d = 1; d <= reach; ++d) {
    for (size_t j : {c + d, c - d}) {
      bool ahead = j > c;
      if (ahead ? (d > options_.match_ahead || j >= n) : (d > options_.match_behind || d > c))
        continue;
      if (!unused(j) || slots_[j].size != size) continue;
      used_in_step_[j] = step_;
      if (ahead) cursor_ = j + 1;
      return {j, j, false};
    }
  }
  // An extra allocation: the expected record is still to come.
  return {kNone, c < n ? c : kNone, false};
}

const PlannedAllocator::Ranges& PlannedAllocator::spare(size_t window, bool own_range_free) {
  size_t key = window == kNone ? kNone : 2 * window + (own_range_free ? 1 : 0);
  auto it = spare_cache_.find(key);
  if (it != spare_cache_.end()) return it->second;
  // Only records from the window's own on are excluded: those allocated before it are
  // either live now (and in free_ as taken) or gone, and then their ranges are free. Slots
  // are in allocation order, so the ones that overlap the window are a contiguous run.
  Ranges used;
  if (window != kNone) {
    for (size_t j = window; j < slots_.size() && slots_[j].s < slots_[window].e; ++j) {
      const Slot& sl = slots_[j];
      if (sl.offset == Plan::kUnplanned) continue;
      if (sl.group >= 0) {  // its members land anywhere in the region
        const Group& g = groups_[size_t(sl.group)];
        used.emplace_back(g.offset, g.offset + g.bytes);
      } else if (j != window || !own_range_free) {
        used.emplace_back(sl.offset, sl.offset + sl.size);
      }
    }
  }
  std::sort(used.begin(), used.end());
  Ranges free_ranges;
  uint64_t cur = 0;
  for (auto [lo, hi] : used) {
    if (lo > cur) free_ranges.emplace_back(cur, lo);
    cur = std::max(cur, hi);
  }
  if (cur < arena_.bytes) free_ranges.emplace_back(cur, arena_.bytes);
  return spare_cache_.emplace(key, std::move(free_ranges)).first->second;
}

uint64_t PlannedAllocator::place_online(uint64_t size, size_t window, bool own_range_free) {
  if (!arena_.base) return Plan::kUnplanned;
  uint64_t off = free_.best_fit(size, spare(window, own_range_free));
  return off == FreeSpace::kNone ? Plan::kUnplanned : off;
}

uint64_t PlannedAllocator::place_in_group(int32_t group, uint64_t size) {
  Group& g = groups_[size_t(group)];
  if (g.step != step_) {
    g.step = step_;
    g.used = 0;
  }
  uint64_t off = g.offset + g.used;
  if (g.used + size > g.bytes || !free_.is_free(off, off + size)) return Plan::kUnplanned;
  g.used += size;
  return off;
}

void* PlannedAllocator::from_arena(uint64_t offset, uint64_t size, size_t requested) {
  free_.take(offset, offset + size);
  arena_.live++;
  void* p = arena_.base + offset;
  blocks_.insert(p, Block{Where::kArena, 0, offset, size, requested});
  return p;
}

void* PlannedAllocator::allocate(size_t bytes, Tag tag) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t size = block_size(bytes, plan_.alignment);
  size_t cursor_before = cursor_;
  bool jump_before = span_jump_;
  span_used_ = true;
  Match m = match(size, tag);
  // The record this request takes, or stands in for with a new size.
  size_t ref = m.slot != kNone ? m.slot : m.own_range_free ? m.window : kNone;
  bool unplanned = m.slot != kNone && slots_[m.slot].offset == Plan::kUnplanned;
  if (m.slot == kNone) planned_stats_.mismatches++;
  uint64_t off = Plan::kUnplanned;
  if (!unplanned) {
    // 1. its group's region, 2. its planned range, 3. idle arena ranges.
    if (ref != kNone && slots_[ref].group >= 0) {
      off = place_in_group(slots_[ref].group, size);
      if (off != Plan::kUnplanned)
        (m.slot != kNone ? planned_stats_.planned : planned_stats_.grouped)++;
    } else if (m.slot != kNone &&
               free_.is_free(slots_[m.slot].offset, slots_[m.slot].offset + size)) {
      off = slots_[m.slot].offset;
      planned_stats_.planned++;
    }
    if (off == Plan::kUnplanned && m.slot != kNone) {
      planned_stats_.conflicts++;  // its place is taken: a block lived longer than planned
      m.window = m.slot;
      m.own_range_free = true;
    }
    if (off == Plan::kUnplanned) {
      off = place_online(size, m.window, m.own_range_free);
      if (off != Plan::kUnplanned) {
        planned_stats_.online++;
        planned_stats_.online_bytes += bytes;
      }
    }
  }
  void* p;
  if (off != Plan::kUnplanned) {
    p = from_arena(off, size, bytes);
  } else {
    try {
      p = fallback_.allocate(bytes, tag);
    } catch (...) {
      // Out of memory: undo the match so that the step can go on as if it never came.
      if (m.slot != kNone) used_in_step_[m.slot] = 0;
      cursor_ = cursor_before;
      span_jump_ = jump_before;
      throw;
    }
    fallback_reserved_ = fallback_.stats().bytes_reserved;
    blocks_.insert(p, Block{Where::kFallback, 0, 0, size, bytes});
    planned_stats_.fallback++;
    planned_stats_.fallback_bytes += bytes;
    planned_stats_.unplanned += unplanned;
  }
  stats_.bytes_live += bytes;
  stats_.num_allocs++;
  stats_.bytes_live_peak = std::max(stats_.bytes_live_peak, stats_.bytes_live);
  note_reserved();
  return p;
}

void PlannedAllocator::free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(ptr);
  WEFT_CHECK(it != blocks_.end(), "PlannedAllocator::free of a pointer it did not allocate: ", ptr);
  span_used_ = true;
  const Block& b = it->second;
  switch (b.where) {
    case Where::kArena:
      free_.give(b.offset, b.offset + b.size);
      arena_.live--;
      break;
    case Where::kRetired: {
      auto r = retired_.find(b.arena);
      if (--r->second.live == 0) {
        arena_source_->release(r->second.base, r->second.bytes);
        planned_stats_.retired_arena_bytes -= r->second.bytes;
        retired_.erase(r);
      }
      break;
    }
    case Where::kFallback:
      fallback_.free(ptr);
      break;
  }
  stats_.bytes_live -= b.requested;
  stats_.num_frees++;
  blocks_.erase(it);
  note_reserved();
}

void PlannedAllocator::note_reserved() {
  stats_.bytes_reserved = arena_.bytes + planned_stats_.retired_arena_bytes + fallback_reserved_;
  stats_.bytes_reserved_peak = std::max(stats_.bytes_reserved_peak, stats_.bytes_reserved);
}

AllocatorStats PlannedAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

PlannedStats PlannedAllocator::planned_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return planned_stats_;
}

void PlannedAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  fallback_.empty_cache();
  fallback_reserved_ = fallback_.stats().bytes_reserved;
  note_reserved();
}

}  // namespace weft::memory
