// ActivationMemory over a recycling allocator (an online resize's trainers): its big segments
// come from the recycler and are kept there when the arena goes, for the next layout's
// blocks; and when a block is still live at the arena's end (a send in flight, which its
// communicator drops later), its segment goes to the recycler once that block is freed
// instead of staying with the dropped arena for the rest of the process.
#include "core/exec/activation_memory.h"

#include <gtest/gtest.h>

#include <cstring>

#include "memory/host_allocator.h"
#include "memory/recycling_allocator.h"

namespace weft::core {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

TEST(ActivationMemory, ItsSegmentsAreKeptByTheRecyclerWhenItGoes) {
  memory::HostAllocator host;
  memory::RecyclingAllocator recycling(host);
  {
    ActivationMemory arena("caching", &recycling);
    arena.begin_step(0);
    void* p = arena.current().allocate(40 * kMiB, memory::Tag::kActivation);
    std::memset(p, 1, 40 * kMiB);
    EXPECT_EQ(recycling.stats().bytes_live, 40 * kMiB);
    arena.current().free(p);
  }
  EXPECT_EQ(recycling.stats().bytes_live, 0u);
  EXPECT_EQ(recycling.bytes_kept(), 40 * kMiB) << "kept for the next trainer, not unmapped";
  recycling.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

TEST(ActivationMemory, ASegmentStillInUseAtItsEndGoesToTheRecyclerWhenFreed) {
  memory::HostAllocator host;
  memory::RecyclingAllocator recycling(host);
  memory::Allocator* current = nullptr;
  void* in_flight = nullptr;
  {
    ActivationMemory arena("caching", &recycling);
    arena.begin_step(0);
    current = &arena.current();
    void* done = current->allocate(40 * kMiB, memory::Tag::kActivation);
    in_flight = current->allocate(60 * kMiB, memory::Tag::kComm);
    current->free(done);
  }
  EXPECT_EQ(recycling.bytes_kept(), 40 * kMiB) << "the free segment at once";
  EXPECT_EQ(recycling.stats().bytes_live, 60 * kMiB) << "the one in use stays";
  current->free(in_flight);  // the communicator drops its send (the allocators were kept)
  EXPECT_EQ(recycling.stats().bytes_live, 0u);
  EXPECT_EQ(recycling.bytes_kept(), 100 * kMiB) << "its segment followed once freed";
  recycling.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

}  // namespace
}  // namespace weft::core
