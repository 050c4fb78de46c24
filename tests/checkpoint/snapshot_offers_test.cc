// What a worker offers a forming world from its node's snapshot segments, and what reading a
// chosen one costs (checkpoint/snapshot_offers.h): every committed slot is offered from its
// header with no payload page mapped in; a read maps in and verifies only its own slot, once,
// and a corrupt block of it is an IoError naming the segment, the slot and the block. A read
// hands out views of the slot in place (checkpoint/snapshot_views.h): they outlive the
// offers, copy out on request, and a rewrite of their slot after the check is told.
#include "checkpoint/snapshot_offers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>

#include "base/error.h"
#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_views.h"
#include "checkpoint/snapshot_writer.h"
#include "tests/checkpoint/snapshot_util.h"

namespace weft::checkpoint {
namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

// A rank's layout of two f32 tensors, 4 MiB + 12 bytes in all: five checksum blocks, the
// last short, and a tensor boundary inside the first block.
parallel::RankLayout two_tensors() {
  return whole_tensors({{{3}, core::DType::kF32}, {{kMiB}, core::DType::kF32}});
}

// The state of `step`: every step's bytes differ.
std::vector<core::Tensor> state_of(const parallel::RankLayout& l, int64_t step) {
  return random_state(l, uint32_t(step));
}

// The KiB mapped in (smaps' Rss) of this process's mappings of shared-memory segment `name`,
// as SnapshotSegmentTest.PopulateMapsInOnlyTheViewsPayload counts them; -1 when none maps it.
int64_t rss_kib_of_segment(const std::string& name) {
  std::ifstream smaps("/proc/self/smaps");
  const std::string file = "/dev/shm" + name;
  bool inside = false;
  int64_t total = -1;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &from, &to) == 2 && line.find(':') > line.find(' ')) {
      inside = line.size() >= file.size() &&
               line.compare(line.size() - file.size(), file.size(), file) == 0;
      continue;
    }
    long kib = 0;
    if (inside && std::sscanf(line.c_str(), "Rss: %ld kB", &kib) == 1)
      total = std::max<int64_t>(total, 0) + kib;
  }
  return total;
}

class SnapshotOffersTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& n : snapshot_segments(job_)) SnapshotSegment::unlink(n);
  }
  SnapshotMeta meta(int64_t step) const { return rank3_meta(job_, layout_, step); }
  // A 3-slot segment of rank 3 (world 4) whose slots hold the states of steps 10, 11, 12,
  // committed as a worker's writer does (checksums computed while copying). Nothing of it
  // stays mapped here: the offers' view is then this process's only mapping of it.
  void write_three_steps() {
    const int64_t bytes = snapshot_payload_bytes(layout_);
    (void)SnapshotSegment::create(name_, bytes, ::getpid(), 3);
    SnapshotWriter w(SnapshotSegment::open(name_, true));
    for (int64_t step : {10, 11, 12}) {
      w.start(meta(step), state_of(layout_, step));
      ASSERT_TRUE(w.wait().has_value());
    }
  }
  const std::string job_ = new_job_id();
  const std::string name_ = segment_name(job_, SegmentKind::kData, 0, 1, 3);
  const parallel::RankLayout layout_ = two_tensors();
};

// Every committed slot is offered, from its header; the reader's mapping holds no payload
// page until a read, and the read maps in and verifies that slot's bytes only: the two
// slots the choice did not use are never mapped in.
TEST_F(SnapshotOffersTest, OffersEverySlotFromItsHeaderAndReadsOnlyTheChosenOne) {
  ASSERT_NO_FATAL_FAILURE(write_three_steps());
  const int64_t bytes = snapshot_payload_bytes(layout_);
  SnapshotOffers offers;
  std::vector<SnapshotMeta> metas = offers.add(name_, job_);
  ASSERT_EQ(metas.size(), 3u);
  std::vector<int64_t> steps;
  for (const SnapshotMeta& m : metas) {
    steps.push_back(m.step);
    EXPECT_EQ(m.rank, 3);
    EXPECT_EQ(m.world, 4);
    EXPECT_EQ(m.payload_bytes, bytes);
    EXPECT_EQ(m.layout_hash, snapshot_layout_hash(layout_));
  }
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, (std::vector<int64_t>{10, 11, 12}));
  // Another job's slots are not this job's offers; the same segment again offers nothing new.
  EXPECT_TRUE(offers.add(name_, new_job_id()).empty());
  EXPECT_TRUE(offers.add(name_, job_).empty());
  EXPECT_EQ(offers.size(), 3u);
  const int64_t before = rss_kib_of_segment(name_);
  ASSERT_GE(before, 0) << "no mapping of " << name_;
  // The headers' pages and what the kernel maps around each on a fault (fault-around, 64 KiB
  // by default): less than one block, where a verified slot maps in all of its 4 MiB.
  EXPECT_LT(before, 1024) << "offering mapped in " << before << " KiB";
  EXPECT_EQ(offers.bytes_read(), 0);

  const std::vector<core::Tensor> got = offers.read(3, 11, layout_);
  const std::vector<core::Tensor> want = state_of(layout_, 11);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(std::memcmp(got[i].raw_data(), want[i].raw_data(), want[i].nbytes()), 0) << i;
  // One slot verified: its payload bytes, no more.
  EXPECT_EQ(offers.bytes_read(), bytes);
  const int64_t after = rss_kib_of_segment(name_);
  std::printf("[ measured ] reader mapped in: %lld KiB after offering 3 slots, %lld KiB after "
              "reading one (%lld KiB of payload a slot)\n",
              (long long)before, (long long)after, (long long)(bytes >> 10));
  EXPECT_GE(after, bytes >> 10) << "the read slot is not all mapped in";
  EXPECT_LE(after, (bytes >> 10) + 4 + before) << "more than the read slot was mapped in";
  EXPECT_THROW(offers.read(3, 13, layout_), InternalError);  // never offered
  offers.clear();
  EXPECT_EQ(offers.size(), 0u);
  EXPECT_EQ(offers.bytes_read(), 0);
}

// A flipped byte in the chosen slot: its read fails naming the segment, the slot, the step
// and the block, and nothing is counted as read; the other slots still read intact.
TEST_F(SnapshotOffersTest, ACorruptBlockOfTheChosenSlotFailsItsReadNamingSlotAndBlock) {
  ASSERT_NO_FATAL_FAILURE(write_three_steps());
  SnapshotOffers offers;
  ASSERT_EQ(offers.add(name_, job_).size(), 3u);
  int slot = -1;
  {
    SnapshotSegment seg = SnapshotSegment::open(name_, true);
    for (int s = 0; s < seg.slots(); ++s)
      if (auto v = seg.slot(s); v && v->meta.step == 12) {
        slot = s;
        const_cast<uint8_t*>(static_cast<const uint8_t*>(v->payload))[3 * kMiB + 5] ^= 0x40;
      }
  }
  ASSERT_GE(slot, 0);
  try {
    (void)offers.read(3, 12, layout_);
    ADD_FAILURE() << "a corrupt slot was read";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("snapshot slot " + std::to_string(slot) + " of " + name_ +
                        " (old rank 3, step 12) not read"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("1 corrupt block(s) of 1048576 bytes, the first at byte 3145728"),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(offers.bytes_read(), 0);
  EXPECT_NO_THROW((void)offers.read(3, 11, layout_));
  EXPECT_EQ(offers.bytes_read(), snapshot_payload_bytes(layout_));
}

// A read copies nothing: its tensors lie in the slot's payload, in layout order, back to back;
// they keep the segment mapped after the offers are cleared; own_snapshot_views copies them
// (the same bytes, outside the segment) and leaves other tensors as they are.
TEST_F(SnapshotOffersTest, AReadViewsTheSlotInPlaceAndOwningCopiesItOut) {
  ASSERT_NO_FATAL_FAILURE(write_three_steps());
  SnapshotOffers offers;
  ASSERT_EQ(offers.add(name_, job_).size(), 3u);
  std::vector<core::Tensor> got = offers.read(3, 12, layout_);
  ASSERT_EQ(got.size(), 2u);
  std::optional<SnapshotSegment::View> v;
  SnapshotSegment seg = SnapshotSegment::open(name_, false);
  for (int s = 0; s < seg.slots(); ++s)
    if (auto x = seg.slot(s); x && x->meta.step == 12) v = x;
  ASSERT_TRUE(v.has_value());
  // Views of the reader's own mapping, not of `seg`'s: their bytes equal the payload's at
  // the layout's offsets, and they are known as views.
  const auto* payload = static_cast<const uint8_t*>(v->payload);
  EXPECT_TRUE(is_snapshot_view(got[0]));
  EXPECT_TRUE(is_snapshot_view(got[1]));
  EXPECT_EQ(std::memcmp(got[0].raw_data(), payload, 12), 0);
  EXPECT_EQ(static_cast<const uint8_t*>(got[1].raw_data()) -
                static_cast<const uint8_t*>(got[0].raw_data()),
            12);
  const std::vector<core::Tensor> want = state_of(layout_, 12);
  offers.clear();  // the views keep their segment mapped
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(std::memcmp(got[i].raw_data(), want[i].raw_data(), want[i].nbytes()), 0) << i;
  core::Tensor other = core::Tensor::zeros({4}, core::DType::kF32);
  std::vector<core::Tensor> moved = {got[0], core::Tensor(), other, got[1]};
  const void* other_at = other.raw_data();
  got.clear();
  EXPECT_EQ(own_snapshot_views(moved), int64_t(want[0].nbytes() + want[1].nbytes()));
  EXPECT_FALSE(is_snapshot_view(moved[0]));
  EXPECT_FALSE(is_snapshot_view(moved[3]));
  EXPECT_FALSE(moved[1].defined());
  EXPECT_EQ(moved[2].raw_data(), other_at);
  EXPECT_EQ(std::memcmp(moved[0].raw_data(), want[0].raw_data(), want[0].nbytes()), 0);
  EXPECT_EQ(std::memcmp(moved[3].raw_data(), want[1].raw_data(), want[1].nbytes()), 0);
  EXPECT_EQ(own_snapshot_views(moved), 0);  // nothing left to copy
}

// Two reads of one slot whose views live at once: each is a view while it lives, and the
// second stays known as one after the first is gone (own_snapshot_views must find it).
TEST_F(SnapshotOffersTest, ASlotReadTwiceStaysKnownAsAViewUntilBothAreGone) {
  ASSERT_NO_FATAL_FAILURE(write_three_steps());
  auto seg = std::make_shared<const SnapshotSegment>(SnapshotSegment::open(name_, false));
  std::optional<SnapshotSegment::View> v = seg->latest();
  ASSERT_TRUE(v.has_value());
  std::vector<core::Tensor> first = view_snapshot(seg, *v, layout_);
  std::vector<core::Tensor> second = view_snapshot(seg, *v, layout_);
  ASSERT_EQ(first[0].raw_data(), second[0].raw_data());
  first.clear();
  EXPECT_TRUE(is_snapshot_view(second[0]));
  EXPECT_TRUE(is_snapshot_view(second[1]));
  EXPECT_EQ(own_snapshot_views(second), snapshot_payload_bytes(layout_));
}

// A slot read and then rewritten (a writer reusing it for a newer step) is named by
// rewritten(); a slot that stayed is not.
TEST_F(SnapshotOffersTest, ASlotRewrittenAfterItsReadIsTold) {
  ASSERT_NO_FATAL_FAILURE(write_three_steps());
  SnapshotOffers offers;
  ASSERT_EQ(offers.add(name_, job_).size(), 3u);
  const std::vector<core::Tensor> newest = offers.read(3, 12, layout_);
  const std::vector<core::Tensor> oldest = offers.read(3, 10, layout_);
  EXPECT_EQ(offers.rewritten(), "");
  // The writer takes the oldest slot (step 10's) for step 13.
  {
    SnapshotWriter w(SnapshotSegment::open(name_, true));
    w.start(meta(13), state_of(layout_, 13));
    ASSERT_TRUE(w.wait().has_value());
  }
  const std::string r = offers.rewritten();
  EXPECT_NE(r.find("(step 10) was rewritten after it was verified"), std::string::npos) << r;
  EXPECT_EQ(r.find("step 12"), std::string::npos) << r;
}

// A worker's own segment is offered through its last writer's mapping (take_segment): no
// second mapping of the segment is made, and a read through it views the same bytes.
TEST_F(SnapshotOffersTest, TheWritersMappingIsOfferedAndReadWithoutASecondMapping) {
  const int64_t bytes = snapshot_payload_bytes(layout_);
  (void)SnapshotSegment::create(name_, bytes, ::getpid(), 3);
  std::shared_ptr<const SnapshotSegment> mine;
  {
    SnapshotWriter w(SnapshotSegment::open(name_, true));
    for (int64_t step : {10, 11}) {
      w.start(meta(step), state_of(layout_, step));
      if (step == 11) {
        EXPECT_THROW((void)w.take_segment(), InternalError);  // in flight
      }
      ASSERT_TRUE(w.wait().has_value());
    }
    mine = std::make_shared<const SnapshotSegment>(w.take_segment());
  }
  ASSERT_EQ(mine->name(), name_);
  auto mappings = [&] {  // this process's mappings of the segment
    std::ifstream maps("/proc/self/maps");
    int n = 0;
    for (std::string line; std::getline(maps, line);)
      n += line.size() >= name_.size() &&
           line.compare(line.size() - name_.size(), name_.size(), name_) == 0;
    return n;
  };
  EXPECT_EQ(mappings(), 1);
  SnapshotOffers offers;
  ASSERT_EQ(offers.add(mine, job_, true).size(), 2u);
  const std::vector<core::Tensor> got = offers.read(3, 11, layout_);
  EXPECT_EQ(mappings(), 1);
  const std::vector<core::Tensor> want = state_of(layout_, 11);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(is_snapshot_view(got[i])) << i;
    EXPECT_EQ(std::memcmp(got[i].raw_data(), want[i].raw_data(), want[i].nbytes()), 0) << i;
  }
}

// What a worker's mapping ahead of a replica (launch/rank_snapshots.h, premap_replicas)
// relies on: slots mapped in once stay mapped in, in that mapping, when a writer rewrites
// them through another (the same tmpfs pages), and the mapping reads the new bytes.
TEST_F(SnapshotOffersTest, SlotsMappedInStayMappedInWhenRewrittenThroughAnotherMapping) {
  write_three_steps();
  const auto reader = std::make_shared<const SnapshotSegment>(SnapshotSegment::open(name_, false));
  const void* at = nullptr;
  for (int slot = 0; slot < reader->slots(); ++slot)
    if (const std::optional<SnapshotSegment::View> v = reader->slot(slot)) {
      reader->populate(*v);
      at = v->payload;
    }
  ASSERT_NE(at, nullptr);
  const int64_t payload_kib = snapshot_payload_bytes(layout_) / 1024;
  const int64_t before = rss_kib_of_mapping(at);
  EXPECT_GE(before, 3 * payload_kib) << "three slots mapped in";
  {
    SnapshotWriter w(SnapshotSegment::open(name_, true));
    for (int64_t step : {13, 14, 15}) {  // every slot rewritten
      w.start(meta(step), state_of(layout_, step));
      ASSERT_TRUE(w.wait().has_value());
    }
  }
  EXPECT_GE(rss_kib_of_mapping(at), before) << "no page of the reader's mapping was dropped";
  SnapshotOffers offers;
  ASSERT_EQ(offers.add(reader, job_, true).size(), 3u);
  const std::vector<core::Tensor> got = offers.read(3, 15, layout_);
  const std::vector<core::Tensor> want = state_of(layout_, 15);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(std::memcmp(got[i].raw_data(), want[i].raw_data(), want[i].nbytes()), 0) << i;
}

}  // namespace
}  // namespace weft::checkpoint
