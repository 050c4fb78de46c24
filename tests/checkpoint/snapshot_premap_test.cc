// PremappedSegments (checkpoint/snapshot_premap.h): the replica slots a worker maps in while
// it trains, so that a recovery reads them without mapping them in. Whether a slot is mapped
// in is read from this process's smaps (Rss of the mapping), so the checks see the page tables
// themselves, not the object's bookkeeping.
#include "checkpoint/snapshot_premap.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/checkpoint/snapshot_util.h"

namespace weft::checkpoint {
namespace {

constexpr int64_t kCap = int64_t(4) << 20;  // per slot: 1024 pages of 4 KiB
constexpr int64_t kCapKib = kCap >> 10;

class SnapshotPremap : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& n : snapshot_segments(job_)) SnapshotSegment::unlink(n);
  }
  std::string name() const { return segment_name(job_, SegmentKind::kReplica, 1, 1, 2); }
  // Commits step `step` into `s` (a slot other than the newest): kCap bytes of `step`.
  static void commit(SnapshotSegment& s, const std::string& job, int64_t step) {
    SnapshotMeta m;
    m.job_id = job;
    m.kind = SegmentKind::kReplica;
    m.owner_node = 1;
    m.epoch = 1;
    m.step = step;
    m.rank = 2;
    m.world = 3;
    m.payload_bytes = kCap;
    std::memset(s.begin(m), int(step), size_t(kCap));
    s.commit();
  }
  // KiB of `seg`'s mapping (the one PremappedSegments made) that are mapped in.
  static int64_t mapped_in_kib(const SnapshotSegment& seg) {
    const std::optional<SnapshotSegment::View> v = seg.latest();
    return v ? rss_kib_of_mapping(v->payload) : -1;
  }
  const std::string job_ = new_job_id();
};

TEST_F(SnapshotPremap, ACommittedSlotIsMappedInOnceAndStaysReadableThroughTheSameMapping) {
  SnapshotSegment writer = SnapshotSegment::create(name(), kCap, ::getpid());
  commit(writer, job_, 4);
  PremappedSegments p;
  EXPECT_EQ(p.mapping(name()), nullptr) << "nothing mapped before map_in";
  // The check can fail: a mapping made by open() alone has no payload page mapped in.
  const SnapshotSegment fresh = SnapshotSegment::open(name(), false);
  EXPECT_LT(mapped_in_kib(fresh), kCapKib / 8);

  p.map_in({name()});
  const std::shared_ptr<const SnapshotSegment> first = p.mapping(name());
  ASSERT_NE(first, nullptr);
  EXPECT_GE(mapped_in_kib(*first), kCapKib) << "the committed slot is mapped in";
  EXPECT_EQ(first->latest()->meta.step, 4);

  // A second slot committed: not offered through the mapping until it is mapped in too.
  commit(writer, job_, 5);
  EXPECT_EQ(p.mapping(name()), nullptr);
  p.map_in({name()});
  const std::shared_ptr<const SnapshotSegment> second = p.mapping(name());
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second.get(), first.get()) << "the segment is not mapped anew";
  EXPECT_GE(mapped_in_kib(*second), 2 * kCapKib) << "both slots mapped in";

  // A slot rewritten (the agent's next commit reuses the older slot): its pages are the same
  // tmpfs pages, still mapped: readable through the same mapping, nothing to map in.
  commit(writer, job_, 6);
  const std::shared_ptr<const SnapshotSegment> third = p.mapping(name());
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third.get(), first.get());
  EXPECT_GE(mapped_in_kib(*third), 2 * kCapKib);
  const std::optional<SnapshotSegment::View> v = third->latest();
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->meta.step, 6);
  EXPECT_EQ(static_cast<const uint8_t*>(v->payload)[kCap - 1], 6) << "the rewritten bytes";
  EXPECT_TRUE(third->corrupt_blocks(*v).empty());
}

TEST_F(SnapshotPremap, ASegmentRecreatedUnderTheSameNameIsMappedAnewAndAnUnnamedOneIsDropped) {
  std::shared_ptr<const SnapshotSegment> old;
  PremappedSegments p;
  {
    SnapshotSegment a = SnapshotSegment::create(name(), kCap, ::getpid());
    commit(a, job_, 4);
    p.map_in({name()});
    old = p.mapping(name());
    ASSERT_NE(old, nullptr);
  }
  // Another generation: the name now holds another segment (another inode), step 9.
  SnapshotSegment::unlink(name());
  SnapshotSegment b = SnapshotSegment::create(name(), kCap, ::getpid());
  commit(b, job_, 9);
  EXPECT_EQ(p.mapping(name()), nullptr) << "the old generation's mapping is not offered";
  p.map_in({name()});
  const std::shared_ptr<const SnapshotSegment> now = p.mapping(name());
  ASSERT_NE(now, nullptr);
  EXPECT_NE(now.get(), old.get()) << "mapped anew";
  EXPECT_EQ(now->latest()->meta.step, 9);
  EXPECT_EQ(old->latest()->meta.step, 4) << "(the old generation's pages are its own)";
  EXPECT_GE(mapped_in_kib(*now), kCapKib);

  p.map_in({});
  EXPECT_EQ(p.mapping(name()), nullptr) << "a segment no longer named is unmapped";
  p.map_in({segment_name(job_, SegmentKind::kReplica, 1, 1, 7)});  // not there: left out
  EXPECT_EQ(p.mapping(segment_name(job_, SegmentKind::kReplica, 1, 1, 7)), nullptr);
}

}  // namespace
}  // namespace weft::checkpoint
