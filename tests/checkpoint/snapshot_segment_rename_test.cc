// SnapshotSegment::rename: a segment made ahead under one name (an ec agent's rebuild
// target, launch/snapshot_parity.h) takes the name a rebuild needs, keeping its memory and
// its mapping; it never replaces another segment.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "base/error.h"
#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_segment.h"

namespace weft::checkpoint {
namespace {

constexpr int64_t kCap = (int64_t(1) << 20) * 2 + 123;

class SnapshotSegmentRename : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& n : snapshot_segments(job_)) SnapshotSegment::unlink(n);
  }
  std::string name(int rank) const { return segment_name(job_, SegmentKind::kRebuilt, 1, 1, rank); }
  SnapshotMeta meta(int rank) const {
    SnapshotMeta m;
    m.job_id = job_;
    m.kind = SegmentKind::kRebuilt;
    m.owner_node = 1;
    m.epoch = 1;
    m.step = 6;
    m.rank = rank;
    m.world = 6;
    m.payload_bytes = kCap;
    return m;
  }
  const std::string job_ = new_job_id();
};

TEST_F(SnapshotSegmentRename, KeepsTheMappingAndTheBytesUnderTheNewName) {
  SnapshotSegment s = SnapshotSegment::create(name(2), kCap, ::getpid(), kMinSnapshotSlots, 0, false);
  // Made ahead: a slot begun and its pages allocated, not committed.
  auto* p = static_cast<uint8_t*>(s.begin(meta(2)));
  s.populate_writing(0, kCap);
  EXPECT_EQ(snapshot_segments(job_), std::vector<std::string>{name(2)});
  s.rename(name(4));
  EXPECT_EQ(s.name(), name(4));
  EXPECT_EQ(snapshot_segments(job_), std::vector<std::string>{name(4)}) << "the old name is gone";
  // The rebuild writes through the mapping it had, into the slot it had begun.
  p = static_cast<uint8_t*>(s.begin(meta(4)));
  for (int64_t i = 0; i < kCap; ++i) p[i] = uint8_t(i * 7 + 3);
  s.commit();
  SnapshotSegment r = SnapshotSegment::open(name(4), false);
  const std::optional<SnapshotSegment::View> v = r.latest();
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->meta.rank, 4);
  EXPECT_EQ(v->meta.payload_bytes, kCap);
  EXPECT_TRUE(r.corrupt_blocks(*v).empty());
  const auto* q = static_cast<const uint8_t*>(v->payload);
  int64_t wrong = 0;
  for (int64_t i = 0; i < kCap; ++i) wrong += q[i] != uint8_t(i * 7 + 3);
  EXPECT_EQ(wrong, 0);
  EXPECT_THROW(SnapshotSegment::open(name(2), false), IoError);
}

TEST_F(SnapshotSegmentRename, NeverReplacesAnotherSegmentAndSaysWhich) {
  SnapshotSegment a = SnapshotSegment::create(name(2), kCap, ::getpid());
  SnapshotSegment b = SnapshotSegment::create(name(3), 4096, ::getpid());
  try {
    a.rename(name(3));
    ADD_FAILURE() << "renamed over an existing segment";
  } catch (const IoError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(name(2)), std::string::npos) << w;
    EXPECT_NE(w.find(name(3)), std::string::npos) << w;
  }
  EXPECT_EQ(a.name(), name(2));
  EXPECT_EQ(SnapshotSegment::open(name(3), false).capacity(), 4096) << "the other one is intact";
  EXPECT_EQ(SnapshotSegment::open(name(2), false).capacity(), kCap);
  EXPECT_NO_THROW(a.rename(name(2))) << "its own name: nothing to do";
}

}  // namespace
}  // namespace weft::checkpoint
