// The new world's first step after a resize takes its activation arena's pages from the last
// trainer's arena: its segments, kept by the process's RecyclingAllocator when that trainer
// went, are expected again at the world's entry (DestinationPrefault::trim with the sizes to
// keep), so the traced step 0 of the new trainer faults no more than a fixed run's second
// step, where the same trainer without them faults in every page of its arena anew. Under a
// layout whose tensors have other sizes, the kept segments are reshaped into them.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "core/exec/activation_memory.h"
#include "launch/live_resize_prefault.h"
#include "memory/host_allocator.h"
#include "memory/recycling_allocator.h"

namespace weft::launch {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

// This thread's minor faults (the allocations and writes below all run on it).
size_t minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  return size_t(u.ru_minflt);
}

// One training step's activations through the arena: `sizes` live at once, each written
// whole (a kernel's output), then freed. Returns the faults the step took.
size_t run_step(core::ActivationMemory& arena, int64_t step, const std::vector<size_t>& sizes) {
  const size_t before = minor_faults();
  arena.begin_step(step);
  std::vector<void*> live;
  for (size_t bytes : sizes) {
    live.push_back(arena.current().allocate(bytes, memory::Tag::kActivation));
    std::memset(live.back(), int(step + 1), bytes);
  }
  for (void* p : live) arena.current().free(p);
  return minor_faults() - before;
}

std::vector<size_t> sorted(std::vector<size_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Blocks of 10 MiB and more get segments of their own size (rounded to 2 MiB), from the
// recycler when at least 32 MiB.
const std::vector<size_t> kStep = {48 * kMiB, 40 * kMiB, 34 * kMiB};

struct Arm {
  size_t fixed_second = 0;  // the fixed run's second step: the yardstick
  size_t first_after = 0;   // the new trainer's first step after the resize
  size_t host_live_in_step = 0;
};

// A fixed run's two steps, its trainer dropped (a resize), the entry (`keep` the last arena's
// sizes, or not), the next trainer's first step asking for `next` sizes.
Arm resize_with(bool keep, const std::vector<size_t>& next) {
  memory::HostAllocator host;
  memory::RecyclingAllocator persistent(host);
  DestinationPrefault prefault(persistent);
  Arm arm;
  std::vector<size_t> arena_sizes;
  {
    core::ActivationMemory old_arena("caching", &persistent);
    const size_t first = run_step(old_arena, 0, kStep);
    arm.fixed_second = run_step(old_arena, 1, kStep);
    EXPECT_GE(first, (48 + 40 + 34) / 2) << "a fresh arena faults its pages in (2 MiB or less each)";
    arena_sizes = old_arena.base_segment_sizes();
  }
  EXPECT_EQ(sorted(arena_sizes), sorted(kStep)) << "each block a segment of its own";
  EXPECT_EQ(persistent.bytes_kept(), 122 * kMiB) << "the old arena's segments stay mapped";
  prefault.trim(keep ? arena_sizes : std::vector<size_t>{});  // the world is entered
  {
    core::ActivationMemory new_arena("caching", &persistent);
    arm.first_after = run_step(new_arena, 0, next);
    arm.host_live_in_step = host.stats().bytes_live;
    prefault.trim();  // after the first step: what it did not take goes
    EXPECT_EQ(persistent.bytes_kept(), 0u);
  }
  persistent.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
  return arm;
}

TEST(FirstStepArena, TheNewTrainersFirstStepFaultsNoMoreThanAFixedRunsSecond) {
  const Arm kept = resize_with(true, kStep);
  const Arm fresh = resize_with(false, kStep);
  std::printf("first step after a resize: %zu faults with the last arena's pages kept, %zu "
              "without; a fixed run's second step: %zu\n",
              kept.first_after, fresh.first_after, kept.fixed_second);
  // The step's bookkeeping (the trace recorder's map, the caching allocator's blocks) may
  // touch a few pages of its own; the arena's 122 MiB are 61 faults at 2 MiB pages, 31232
  // at 4 KiB.
  EXPECT_LE(kept.first_after, kept.fixed_second + 8);
  EXPECT_GE(fresh.first_after, 61u) << "the yardstick: without them every page is fresh";
  EXPECT_EQ(kept.host_live_in_step, 122 * kMiB) << "the kept segments are the arena's";
}

// Another layout: the new trainer's blocks have other sizes than the kept segments; each
// request takes one of them reshaped (its pages stay, only growth is fresh), so the step's
// memory is its own arena, not that beside the old one's, and it faults only what it adds.
TEST(FirstStepArena, UnderAnotherLayoutTheKeptSegmentsAreReshaped) {
  const std::vector<size_t> next = {56 * kMiB, 36 * kMiB, 32 * kMiB};  // 124 MiB
  const Arm kept = resize_with(true, next);
  const Arm fresh = resize_with(false, next);
  std::printf("first step under another layout: %zu faults with the last arena's pages kept, "
              "%zu without\n",
              kept.first_after, fresh.first_after);
  // 48 -> 56 MiB adds 8 MiB, at most 2048 faults of 4 KiB; the others shrink.
  EXPECT_LE(kept.first_after, kept.fixed_second + 8 + 2048);
  EXPECT_GE(fresh.first_after, 62u);
  EXPECT_LT(kept.first_after, fresh.first_after);
  EXPECT_EQ(kept.host_live_in_step, 124 * kMiB) << "reshaped, not held beside new blocks";
}

}  // namespace
}  // namespace weft::launch
