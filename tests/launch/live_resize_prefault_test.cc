// What a rank of an online resize faults in ahead: its next layout's persistent blocks less
// those it holds already (adopted), within the move's memory bound; and the one reserve at a
// time that a survivor starts when a change is known and a newcomer while the world forms.
#include "launch/live_resize_prefault.h"

#include <gtest/gtest.h>

#include <vector>

#include "memory/host_allocator.h"
#include "parallel/vps.h"
#include "planner/plan_cache.h"
#include "tests/launch/zero1_spec.h"

namespace weft::launch {
namespace {

// The bytes of the blocks of at least 1 KiB: sizes match by size only, and the 8-byte
// scalars of a layout (step, data cursor, RNG, beside the program's tensors) may stand for
// each other; a RecyclingAllocator reserves nothing that small.
size_t large(const std::vector<size_t>& v) {
  size_t n = 0;
  for (size_t s : v) n += s >= 1024 ? s : 0;
  return n;
}

// What rank `rank` of `layout` holds after training in it: a tensor per local.
HeldState held_of(const parallel::Layout& layout, int rank) {
  HeldState h;
  h.valid = true;
  h.rank = rank;
  h.world = int(layout.ranks.size());
  HeldPiece p{rank, h.world, {}, {}};
  for (const parallel::LocalTensor& lt : layout.ranks[size_t(rank)].locals)
    p.tensors.push_back(core::Tensor::empty(lt.shape, lt.dtype));
  h.pieces.push_back(std::move(p));
  return h;
}

// The small ZeRO-1 job: a rank that stays in a world of the same size holds every state
// tensor it will have (only its gradients are new); one that goes from 2 ranks to 3 keeps its
// replicated parameters but its moments' shards change size; a newcomer needs everything.
TEST(SizesToFault, TheNextLayoutsPersistentBlocksLessTheHeldOnesBySize) {
  const core::JobSpec spec = zero1_spec();
  planner::PlanCache plans{spec};
  const parallel::StateSpace space = parallel::StateSpace::from_graph(plans.graph()->graph);
  const parallel::Layout l2 = parallel::layout_of(space, *plans.plan(2));
  const HeldState held = held_of(l2, 0);
  size_t held_program = 0;  // its blocks of at least 1 KiB
  for (const parallel::LocalTensor& lt : l2.ranks[0].locals)
    if (lt.bytes() >= 1024) held_program += size_t(lt.bytes());
  ASSERT_GT(held_program, 0u);

  const std::vector<size_t> all2 = persistent_sizes(*plans.plan(2), 0);
  EXPECT_EQ(sizes_to_fault(*plans.plan(2), 0, HeldState{}), all2) << "a newcomer: all of them";
  EXPECT_EQ(large(sizes_to_fault(*plans.plan(2), 0, held)), large(all2) - held_program)
      << "the same layout: every held tensor is one of the new ones";

  const std::vector<size_t> all3 = persistent_sizes(*plans.plan(3), 0);
  const size_t to3 = large(sizes_to_fault(*plans.plan(3), 0, held));
  EXPECT_LT(to3, large(all3)) << "the replicated parameters are held already";
  EXPECT_GT(to3 + held_program, large(all3)) << "the moments' shards of 3 ranks are not";
}

TEST(PrefaultBound, TheMovesBoundLessWhatTheRankHolds) {
  const int64_t mib = int64_t(1) << 20;
  const std::vector<size_t> six{size_t(200 * mib), size_t(400 * mib)};
  // A survivor of dp3 -> dp2 under ZeRO-3: 400 held, 600 next: 600 + 256 - 400.
  EXPECT_EQ(prefault_bound(400 * mib, six, 256 * mib), size_t(456 * mib));
  // A shrinking holding (dp2 -> dp3): the budget alone.
  EXPECT_EQ(prefault_bound(900 * mib, six, 256 * mib), size_t(256 * mib));
  // Nothing held (a torn rank): all of it and the budget.
  EXPECT_EQ(prefault_bound(0, six, 256 * mib), size_t(856 * mib));
  // At a notice, beside the step: 400 of state and 100 of gradients held now, the bound
  // less all 500 (600 + 256 - 500); gradients that outgrow the budget leave nothing.
  EXPECT_EQ(prefault_bound(400 * mib, six, 256 * mib, 500 * mib), size_t(356 * mib));
  EXPECT_EQ(prefault_bound(900 * mib, six, 256 * mib, 1200 * mib), size_t(0));
}

// A reserve started at a notice within the bound beside the step goes on at the step
// boundary within the larger one (the same sizes, a larger bound): it never holds more than
// the bound of the moment, in all, and the trainer's gradients (returning) are not faulted
// anew but kept for their size when freed.
TEST(DestinationPrefault, ALeavesReserveStartsAtItsNoticeAndGrowsAtTheBoundary) {
  memory::HostAllocator host;
  memory::RecyclingAllocator persistent(host, 1024);
  {
    DestinationPrefault pf(persistent);
    void* grad = persistent.allocate(8192);  // the old trainer's gradient, live in the step
    const std::vector<size_t> next{16384, 16384, 8192, 4096};
    pf.start(next, 16384 + 4096, {8192});  // at the notice: what the step leaves room for
    EXPECT_EQ(pf.wait(), 16384u + 4096u) << "within the notice's bound; the 8192 is returning";
    EXPECT_EQ(pf.max_bytes(), 16384u + 4096u);
    EXPECT_EQ(persistent.bytes_kept(), 16384u + 4096u);
    persistent.free(grad);  // the step's end: kept for the next layout's gradient
    EXPECT_EQ(persistent.bytes_kept(), 16384u + 4096u + 8192u);
    pf.start(next, 16384 + 4096);  // a smaller bound for the same sizes: nothing more
    EXPECT_FALSE(pf.started());
    pf.start(next, 2 * 16384 + 4096);  // the boundary's bound: goes on
    EXPECT_TRUE(pf.started());
    EXPECT_EQ(pf.wait(), 16384u) << "only the second 16384: the rest is kept already";
    EXPECT_EQ(persistent.bytes_kept(), 2u * 16384u + 8192u + 4096u);
    EXPECT_LE(host.stats().bytes_live, 2u * 16384u + 8192u + 4096u) << "nothing beyond the bound";
    pf.trim();
  }
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

// One reserve at a time: the same sizes again start nothing; other sizes trim the kept
// blocks to themselves; trim() returns everything, and the same sizes fault in again.
TEST(DestinationPrefault, OneReserveAtATimeRetargetedByNewSizes) {
  memory::HostAllocator host;
  memory::RecyclingAllocator persistent(host, 1024);
  {
    DestinationPrefault pf(persistent);
    pf.start({4096, 8192}, SIZE_MAX);
    EXPECT_TRUE(pf.started());
    EXPECT_EQ(pf.wait(), 4096u + 8192u);
    EXPECT_EQ(persistent.bytes_kept(), 4096u + 8192u);
    pf.start({4096, 8192}, SIZE_MAX);
    EXPECT_FALSE(pf.started()) << "the same sizes: done already";
    pf.expect({8192, 2048});
    EXPECT_EQ(persistent.bytes_kept(), 8192u) << "the 4096 is not wanted; 2048 not faulted";
    void* p = persistent.allocate(8192);
    void* q = persistent.allocate(2048);
    persistent.free(p);
    persistent.free(q);
    pf.trim();
    EXPECT_EQ(persistent.bytes_kept(), 0u);
    pf.start({8192}, 4096);
    EXPECT_EQ(pf.wait(), 0u) << "over its bound";
    pf.start({4096}, SIZE_MAX);
    EXPECT_EQ(pf.wait(), 4096u);
  }
  EXPECT_EQ(persistent.bytes_kept(), 4096u) << "kept until the allocator's trim";
  persistent.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

}  // namespace
}  // namespace weft::launch
