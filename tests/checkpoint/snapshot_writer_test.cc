// The snapshot writer: a background copy of a rank's state into its segment whose
// checksums are computed while copying, the read back into the rank's layout, and what a
// read refuses (a corrupted block, another layout, a slot rewritten meanwhile).
#include "checkpoint/snapshot_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <random>

#include "base/error.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_views.h"
#include "tests/checkpoint/snapshot_util.h"

namespace weft::checkpoint {
namespace {

// A rank's layout of three tensors whose bytes cross checksum blocks unevenly: 300k floats
// (1.14 MiB), 5 i64 scalars, and 700k floats (2.67 MiB).
parallel::RankLayout three_tensors() {
  return whole_tensors(
      {{{300, 1000}, core::DType::kF32}, {{5}, core::DType::kI64}, {{700000}, core::DType::kF32}});
}

bool same_bytes(const core::Tensor& a, const core::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

class SnapshotWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_ = new_job_id();
    name_ = segment_name(job_, SegmentKind::kData, 0, 1, 3);
  }
  void TearDown() override { SnapshotSegment::unlink(name_); }
  SnapshotMeta meta(int64_t step) const { return rank3_meta(job_, layout_, step); }
  std::string job_, name_;
  parallel::RankLayout layout_ = three_tensors();
};

TEST_F(SnapshotWriterTest, CopiesInTheBackgroundAndReadsBackTheSameBytes) {
  const int64_t bytes = snapshot_payload_bytes(layout_);
  EXPECT_EQ(bytes, 300000 * 4 + 5 * 8 + 700000 * 4);
  SnapshotSegment owner = SnapshotSegment::create(name_, bytes, ::getpid());
  SnapshotWriter w(SnapshotSegment::open(name_, true));
  const std::vector<core::Tensor> s10 = random_state(layout_, 10), s11 = random_state(layout_, 11);
  w.start(meta(10), s10);
  EXPECT_TRUE(w.in_flight());
  std::optional<SnapshotMeta> m = w.wait();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->step, 10);
  EXPECT_EQ(m->payload_bytes, bytes);
  EXPECT_FALSE(w.wait().has_value());  // nothing in flight any more
  // The checksums computed while copying are those of the committed bytes.
  std::optional<SnapshotSegment::View> v = owner.latest();
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(owner.corrupt_blocks(*v).empty());
  EXPECT_EQ(owner.block_crc32c(*v).size(), size_t((bytes + kSnapshotBlockBytes - 1) / kSnapshotBlockBytes));
  std::vector<core::Tensor> back = read_snapshot(owner, *v, layout_);
  ASSERT_EQ(back.size(), s10.size());
  for (size_t i = 0; i < back.size(); ++i) EXPECT_TRUE(same_bytes(back[i], s10[i])) << i;
  // A second snapshot goes to the other slot; start() commits the one in flight first.
  w.start(meta(11), s11);
  w.start(meta(12), s10);  // waits for step 11's copy and commits it
  v = owner.latest();
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->meta.step, 11);
  back = read_snapshot(owner, *v, layout_);
  for (size_t i = 0; i < back.size(); ++i) EXPECT_TRUE(same_bytes(back[i], s11[i])) << i;
  w.wait();
  EXPECT_EQ(owner.latest()->meta.step, 12);
}

TEST_F(SnapshotWriterTest, AReadRefusesACorruptBlockAnotherLayoutAndARewrite) {
  SnapshotSegment owner = SnapshotSegment::create(name_, snapshot_payload_bytes(layout_), ::getpid());
  SnapshotWriter w(SnapshotSegment::open(name_, true));
  w.start(meta(5), random_state(layout_, 5));
  w.wait();
  std::optional<SnapshotSegment::View> v = owner.latest();
  ASSERT_TRUE(v.has_value());
  // Another layout: the second tensor split differently.
  parallel::RankLayout other = layout_;
  other.boxes[1].extent = {4};
  other.locals[1].shape = {4};
  try {
    read_snapshot(owner, *v, other);
    ADD_FAILURE() << "another layout was read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("other boxes"), std::string::npos) << e.what();
  }
  // A flipped byte in the third block (byte 2.5 MiB) is named with its block.
  {
    SnapshotSegment rw = SnapshotSegment::open(name_, true);
    std::optional<SnapshotSegment::View> wv = rw.latest();
    auto* p = const_cast<uint8_t*>(static_cast<const uint8_t*>(wv->payload));
    p[2 * kSnapshotBlockBytes + kSnapshotBlockBytes / 2] ^= 0x10;
  }
  try {
    read_snapshot(owner, *v, layout_);
    ADD_FAILURE() << "a corrupted snapshot was read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("1 corrupt block(s) of 1048576 bytes, the first at byte 2097152"),
              std::string::npos)
        << e.what();
  }
  // Rewritten while read: the view's slot is reused by a writer two commits later.
  w.start(meta(6), random_state(layout_, 6));
  w.wait();
  w.start(meta(7), random_state(layout_, 7));
  w.wait();
  try {
    read_snapshot(owner, *v, layout_);
    ADD_FAILURE() << "a rewritten slot was read as step 5";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("rewritten"), std::string::npos) << e.what();
  }
}

// A slot of 64 MiB or more is read by two threads, each half of the blocks (read_snapshot):
// here 70.6 MiB whose middle tensor straddles the split at block 35. The bytes come back
// whole, and a corrupt block on either side of the split is counted, the first one named.
TEST_F(SnapshotWriterTest, ALargeSlotReadInTwoHalvesComesBackWholeAndFindsCorruptBlocksInBoth) {
  layout_ = whole_tensors({{{3000, 1000}, core::DType::kF32},  // 11.4 MiB
                           {{12500000}, core::DType::kF32},    // 47.7 MiB: across the split
                           {{7}, core::DType::kI64},
                           {{3000000}, core::DType::kF32}});  // 11.4 MiB
  const int64_t bytes = snapshot_payload_bytes(layout_);
  ASSERT_GE(bytes, int64_t(64) << 20);
  SnapshotSegment owner = SnapshotSegment::create(name_, bytes, ::getpid());
  SnapshotWriter w(SnapshotSegment::open(name_, true));
  const std::vector<core::Tensor> state = random_state(layout_, 21);
  w.start(meta(21), state);
  w.wait();
  std::optional<SnapshotSegment::View> v = owner.latest();
  ASSERT_TRUE(v.has_value());
  std::vector<core::Tensor> back = read_snapshot(owner, *v, layout_);
  ASSERT_EQ(back.size(), state.size());
  for (size_t i = 0; i < back.size(); ++i) EXPECT_TRUE(same_bytes(back[i], state[i])) << i;
  const int64_t half_block = bytes / 2 / kSnapshotBlockBytes;  // the second thread's first
  {
    SnapshotSegment rw = SnapshotSegment::open(name_, true);
    auto* p = const_cast<uint8_t*>(static_cast<const uint8_t*>(rw.latest()->payload));
    p[(half_block - 1) * kSnapshotBlockBytes + 3] ^= 0x01;  // the first half's last block
    p[(half_block + 2) * kSnapshotBlockBytes + 9] ^= 0x80;  // in the second half
  }
  try {
    read_snapshot(owner, *v, layout_);
    ADD_FAILURE() << "a corrupted snapshot was read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("2 corrupt block(s) of 1048576 bytes, the first at byte " +
                                         std::to_string((half_block - 1) * kSnapshotBlockBytes)),
              std::string::npos)
        << e.what();
  }
}

// The zero-copy read of the same 70.6 MiB slot (view_snapshot): checked by two threads, each
// half of the blocks; its views hold the bytes, copied out whole by two threads
// (own_snapshot_views, the split inside the middle tensor); a corrupt block on either side of
// the split is counted, the first one named, and no view is handed out then.
TEST_F(SnapshotWriterTest, ALargeSlotViewedInPlaceIsCheckedInTwoHalvesAndCopiesOutWhole) {
  layout_ = whole_tensors({{{3000, 1000}, core::DType::kF32},
                           {{12500000}, core::DType::kF32},
                           {{7}, core::DType::kI64},
                           {{3000000}, core::DType::kF32}});
  const int64_t bytes = snapshot_payload_bytes(layout_);
  ASSERT_GE(bytes, int64_t(64) << 20);
  SnapshotSegment owner = SnapshotSegment::create(name_, bytes, ::getpid());
  SnapshotWriter w(SnapshotSegment::open(name_, true));
  const std::vector<core::Tensor> state = random_state(layout_, 22);
  w.start(meta(22), state);
  w.wait();
  auto reader = std::make_shared<const SnapshotSegment>(SnapshotSegment::open(name_, false));
  std::optional<SnapshotSegment::View> v = reader->latest();
  ASSERT_TRUE(v.has_value());
  std::vector<core::Tensor> views = view_snapshot(reader, *v, layout_);
  ASSERT_EQ(views.size(), state.size());
  for (size_t i = 0; i < views.size(); ++i) {
    EXPECT_TRUE(is_snapshot_view(views[i])) << i;
    EXPECT_TRUE(same_bytes(views[i], state[i])) << i;
  }
  EXPECT_EQ(own_snapshot_views(views), bytes);
  for (size_t i = 0; i < views.size(); ++i) {
    EXPECT_FALSE(is_snapshot_view(views[i])) << i;
    EXPECT_TRUE(same_bytes(views[i], state[i])) << i;
  }
  const int64_t half_block = bytes / 2 / kSnapshotBlockBytes;  // the second thread's first
  {
    SnapshotSegment rw = SnapshotSegment::open(name_, true);
    auto* p = const_cast<uint8_t*>(static_cast<const uint8_t*>(rw.latest()->payload));
    p[(half_block - 1) * kSnapshotBlockBytes + 3] ^= 0x01;
    p[(half_block + 2) * kSnapshotBlockBytes + 9] ^= 0x80;
  }
  try {
    (void)view_snapshot(reader, *v, layout_);
    ADD_FAILURE() << "a corrupted snapshot was viewed";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("2 corrupt block(s) of 1048576 bytes, the first at byte " +
                                         std::to_string((half_block - 1) * kSnapshotBlockBytes)),
              std::string::npos)
        << e.what();
  }
}

TEST_F(SnapshotWriterTest, AStateLargerThanTheSegmentIsRefusedBeforeAnyByteMoves) {
  SnapshotSegment owner = SnapshotSegment::create(name_, 1000, ::getpid());
  SnapshotWriter w(SnapshotSegment::open(name_, true));
  EXPECT_THROW(w.start(meta(1), random_state(layout_, 1)), InternalError);
  EXPECT_FALSE(w.in_flight());
  EXPECT_FALSE(owner.latest().has_value());
}

}  // namespace
}  // namespace weft::checkpoint
