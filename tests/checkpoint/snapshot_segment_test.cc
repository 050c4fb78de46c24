// The snapshot segment: create/open/unlink, two slots that alternate with the newer one as
// the snapshot (three that rotate, and version 1's two), owner and guardian (abandoned only
// when both are gone; version 2 had no guardian), readers in other processes, a writer
// SIGKILLed mid-write (the previous snapshot stays whole), corruption found at its block, and the
// names of a job's segments. Each test has its own job id and removes its segments in TearDown,
// even when it fails.
#include "checkpoint/snapshot_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "base/error.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/job_id.h"
#include "tests/checkpoint/snapshot_util.h"

namespace weft::checkpoint {
namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

// The byte at offset i of the payload of `step`: every step's payload differs everywhere.
uint8_t pattern(int64_t step, int64_t i) {
  return uint8_t((i * 131 + step * 7 + (i >> 12)) & 0xff);
}
void fill(void* p, int64_t step, int64_t from, int64_t to) {
  auto* b = static_cast<uint8_t*>(p);
  for (int64_t i = from; i < to; ++i) b[i] = pattern(step, i);
}
bool holds(const void* p, int64_t step, int64_t bytes) {
  auto* b = static_cast<const uint8_t*>(p);
  for (int64_t i = 0; i < bytes; ++i)
    if (b[i] != pattern(step, i)) return false;
  return true;
}

// A forked child that is always reaped: wait() for its status, or the destructor kills it.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  Child(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // The raw wait status; SIGKILL after `timeout` so a stuck child fails instead of hanging.
  int wait(std::chrono::seconds timeout = std::chrono::seconds(30)) {
    int status = 0;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_;
};

// Runs `fn` in a forked child; its return value is the exit code (an exception: 99).
template <typename Fn>
pid_t fork_child(Fn fn) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = fn();
    } catch (...) {
    }
    ::_exit(code);
  }
  return pid;
}

class SnapshotSegmentTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& n : snapshot_segments(job_)) SnapshotSegment::unlink(n);
  }
  std::string name(int rank = 0, SegmentKind kind = SegmentKind::kData) const {
    return segment_name(job_, kind, 0, 1, rank);
  }
  SnapshotMeta meta(int64_t step, int64_t bytes) const {
    SnapshotMeta m;
    m.job_id = job_;
    m.owner_node = 0;
    m.epoch = 1;
    m.step = step;
    m.rank = 3;
    m.world = 4;
    m.layout_hash = 0x1234abcd;
    m.payload_bytes = bytes;
    return m;
  }
  // Writes the payload of `step` (`bytes` long) and commits it.
  SnapshotMeta write(SnapshotSegment& s, int64_t step, int64_t bytes) {
    fill(s.begin(meta(step, bytes)), step, 0, bytes);
    return s.commit();
  }
  const std::string job_ = new_job_id();
};

TEST_F(SnapshotSegmentTest, CreateOpenUnlinkRoundTrip) {
  const int64_t cap = 3 * kMiB + 5;
  {
    SnapshotSegment s = SnapshotSegment::create(name(), cap, ::getpid());
    EXPECT_EQ(s.name(), name());
    EXPECT_EQ(s.capacity(), cap);
    EXPECT_EQ(s.owner_pid(), ::getpid());
    EXPECT_FALSE(s.owner_gone());
    EXPECT_FALSE(s.latest().has_value());
    EXPECT_EQ(s.sequence(0), 0);
    EXPECT_EQ(s.sequence(1), 0);
    write(s, 7, cap);
  }
  SnapshotSegment r = SnapshotSegment::open(name(), false);
  EXPECT_EQ(r.capacity(), cap);
  EXPECT_EQ(r.owner_pid(), ::getpid());
  std::optional<SnapshotSegment::View> v = r.latest();
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->meta.step, 7);
  EXPECT_EQ(v->meta.job_id, job_);
  EXPECT_EQ(v->meta.rank, 3);
  EXPECT_EQ(v->meta.world, 4);
  EXPECT_EQ(v->meta.layout_hash, 0x1234abcdu);
  EXPECT_EQ(v->meta.payload_bytes, cap);
  EXPECT_TRUE(holds(v->payload, 7, cap));
  // The payload of every slot starts on a page boundary.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v->payload) % uintptr_t(::sysconf(_SC_PAGESIZE)), 0u);
  // Moving keeps the mapping; unlinking leaves the mapping readable but the name gone.
  SnapshotSegment moved = std::move(r);
  SnapshotSegment::unlink(name());
  EXPECT_TRUE(holds(moved.latest()->payload, 7, cap));
  EXPECT_THROW(SnapshotSegment::open(name(), false), IoError);
  EXPECT_NO_THROW(SnapshotSegment::unlink(name()));  // already gone: no error
  EXPECT_TRUE(snapshot_segments(job_).empty());
}

TEST_F(SnapshotSegmentTest, CommitsAlternateSlotsAndLatestIsTheNewer) {
  SnapshotSegment s = SnapshotSegment::create(name(), 2 * kMiB, ::getpid());
  SnapshotSegment r = SnapshotSegment::open(name(), false);
  for (int64_t step = 1; step <= 5; ++step) {
    const int64_t bytes = step * 300000;
    SnapshotMeta m = write(s, step * 10, bytes);
    EXPECT_EQ(m.sequence, step);
    EXPECT_EQ(m.step, step * 10);
    std::optional<SnapshotSegment::View> v = r.latest();
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(v->slot, int((step - 1) % 2)) << "step " << step;
    EXPECT_EQ(v->meta.sequence, step);
    EXPECT_EQ(v->meta.step, step * 10);
    EXPECT_EQ(v->meta.payload_bytes, bytes);
    EXPECT_TRUE(holds(v->payload, step * 10, bytes));
    EXPECT_TRUE(r.corrupt_blocks(*v).empty());
    // The other slot still holds the previous snapshot, whole.
    if (step > 1) {
      std::optional<SnapshotSegment::View> prev = r.slot(1 - v->slot);
      ASSERT_TRUE(prev.has_value());
      EXPECT_EQ(prev->meta.step, (step - 1) * 10);
      EXPECT_TRUE(holds(prev->payload, (step - 1) * 10, (step - 1) * 300000));
    }
  }
  // Checksums the writer computed while copying are taken as given.
  const int64_t bytes = kMiB + 17;
  void* p = s.begin(meta(60, bytes));
  fill(p, 60, 0, bytes);
  std::vector<uint32_t> crcs = {crc32c(p, size_t(kMiB)), crc32c(static_cast<char*>(p) + kMiB, 17)};
  SnapshotMeta m = s.commit(crcs);
  EXPECT_EQ(m.sequence, 6);
  std::optional<SnapshotSegment::View> v = r.latest();
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(r.block_crc32c(*v), crcs);
  EXPECT_TRUE(r.corrupt_blocks(*v).empty());
  // An empty payload is a snapshot too (no blocks).
  EXPECT_EQ(write(s, 61, 0).sequence, 7);
  EXPECT_EQ(r.latest()->meta.step, 61);
  EXPECT_TRUE(r.block_crc32c(*r.latest()).empty());
}

// Three slots (a job whose snapshots are replicated): the writer never touches the newest
// committed slot, fills an empty one first and then the oldest, so the three newest commits
// are always whole. A half-written slot is the one reused next.
TEST_F(SnapshotSegmentTest, ThreeSlotsKeepTheThreeNewestCommits) {
  SnapshotSegment s = SnapshotSegment::create(name(), kMiB, ::getpid(), 3);
  SnapshotSegment r = SnapshotSegment::open(name(), false);
  EXPECT_EQ(s.slots(), 3);
  EXPECT_EQ(r.slots(), 3);
  for (int64_t step = 1; step <= 7; ++step) {
    write(s, step, 1000 + step);
    EXPECT_EQ(r.latest()->meta.step, step);
    EXPECT_EQ(r.latest()->slot, int((step - 1) % 3)) << "step " << step;
    std::vector<int64_t> held;
    for (int i = 0; i < 3; ++i)
      if (std::optional<SnapshotSegment::View> v = r.slot(i)) {
        EXPECT_TRUE(holds(v->payload, v->meta.step, v->meta.payload_bytes));
        held.push_back(v->meta.step);
      }
    std::sort(held.begin(), held.end());
    std::vector<int64_t> want;
    for (int64_t k = std::max<int64_t>(1, step - 2); k <= step; ++k) want.push_back(k);
    EXPECT_EQ(held, want) << "step " << step;
  }
  // Steps 5, 6, 7 in slots 1, 2, 0; a write begun and abandoned uncommits the oldest (5)...
  void* p = s.begin(meta(8, 10));
  fill(p, 8, 0, 10);
  EXPECT_FALSE(r.slot(1).has_value());
  // ... and a fresh writer (the old one killed) takes that slot again, not step 6's.
  SnapshotSegment again = SnapshotSegment::open(name(), true);
  write(again, 9, 100);
  EXPECT_EQ(r.latest()->slot, 1);
  EXPECT_EQ(r.slot(2)->meta.step, 6);
  EXPECT_EQ(r.slot(0)->meta.step, 7);
  EXPECT_THROW(r.slot(3), InternalError);
}

// A reader maps in only the slot it reads (populate), never the whole segment: the other
// slots are pages that nobody wrote (create() allocates them), which the first mapping of
// each zeroes. A whole 3-slot segment of 403 MiB slots, populated by every survivor when
// offering its snapshots, held a node-loss recovery 2.5 s (issue 15).
TEST_F(SnapshotSegmentTest, PopulateMapsInOnlyTheViewsPayload) {
  constexpr int64_t kCapacity = 16 * kMiB;
  SnapshotSegment s = SnapshotSegment::create(name(), kCapacity, ::getpid(), 3);
  write(s, 1, kCapacity);
  SnapshotSegment r = SnapshotSegment::open(name(), false);
  std::optional<SnapshotSegment::View> v = r.latest();
  ASSERT_TRUE(v.has_value());
  for (int i = 0; i < r.slots(); ++i) (void)r.slot(i);  // every slot header read, as offers do
  const int64_t before = rss_kib_of_mapping(v->payload);
  ASSERT_GE(before, 0) << "no mapping holds the payload";
  EXPECT_LT(before, 1024) << "opening mapped in " << before << " KiB";
  r.populate(*v);
  const int64_t after = rss_kib_of_mapping(v->payload);
  std::printf(
      "[ measured ] mapped in: %lld KiB after open, %lld KiB after populate (slot %lld "
      "KiB, segment %lld KiB)\n",
      (long long)before, (long long)after, (long long)(kCapacity >> 10),
      (long long)(3 * kCapacity >> 10));
  EXPECT_GE(after, kCapacity >> 10) << "the payload is not all mapped in";
  EXPECT_LT(after, (kCapacity >> 10) + 1024) << "more than the payload's slot was mapped in";
  EXPECT_EQ(r.corrupt_blocks(*v), std::vector<int64_t>{});
  EXPECT_EQ(rss_kib_of_mapping(v->payload), after) << "reading the payload mapped in more";
}

// A segment of format version 1 (two slots, no slot count) is read as two slots.
TEST_F(SnapshotSegmentTest, AVersionOneSegmentReadsAsTwoSlots) {
  {
    SnapshotSegment s = SnapshotSegment::create(name(), kMiB, ::getpid());
    write(s, 3, 500);
    write(s, 4, 600);
  }
  const int fd = ::shm_open(name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  const uint32_t one = 1;
  const int64_t zero = 0;
  ASSERT_EQ(::pwrite(fd, &one, sizeof one, 8), ssize_t(sizeof one));      // version
  ASSERT_EQ(::pwrite(fd, &zero, sizeof zero, 72), ssize_t(sizeof zero));  // slots
  ::close(fd);
  SnapshotSegment r = SnapshotSegment::open(name(), false);
  EXPECT_EQ(r.slots(), 2);
  EXPECT_EQ(r.latest()->meta.step, 4);
  EXPECT_EQ(r.slot(r.latest()->slot == 0 ? 1 : 0)->meta.step, 3);
  // Taken over, it becomes the current version with its slot count written out.
  SnapshotSegment::open(name(), true).set_owner(::getpid(), 0);
  SnapshotSegment now = SnapshotSegment::open(name(), false);
  EXPECT_EQ(now.version(), int(kSnapshotFormatVersion));
  EXPECT_EQ(now.slots(), 2);
  EXPECT_EQ(now.latest()->meta.step, 4);
}

TEST_F(SnapshotSegmentTest, ReaderInAForkedChildSeesTheCommittedData) {
  const int64_t bytes = 3 * kMiB + 1000;
  SnapshotSegment s = SnapshotSegment::create(name(), 4 * kMiB, ::getpid());
  write(s, 41, bytes);
  write(s, 42, bytes);
  const std::string job = job_, seg = name();
  Child child(fork_child([&] {
    SnapshotSegment r = SnapshotSegment::open(seg, false);
    std::optional<SnapshotSegment::View> v = r.latest();
    if (!v) return 1;
    if (v->meta.step != 42 || v->meta.sequence != 2 || v->meta.job_id != job) return 2;
    if (!holds(v->payload, 42, bytes)) return 3;
    if (!r.corrupt_blocks(*v).empty()) return 4;
    return 0;
  }));
  int status = child.wait();
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// The kill lands at a known point: the child has begun the second snapshot and written half
// of its payload when the parent SIGKILLs it.
TEST_F(SnapshotSegmentTest, WriterKilledMidWriteLeavesThePreviousSnapshot) {
  const int64_t bytes = 6 * kMiB + 123;
  {
    SnapshotSegment s = SnapshotSegment::create(name(), 8 * kMiB, ::getpid());
    write(s, 100, bytes);
  }
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string seg = name();
  SnapshotMeta second = meta(200, bytes);
  Child child(fork_child([&] {
    ::close(fds[0]);
    SnapshotSegment w = SnapshotSegment::open(seg, true);
    void* p = w.begin(second);
    fill(p, 200, 0, bytes / 2);
    char c = 'x';
    if (::write(fds[1], &c, 1) != 1) return 1;
    for (;;) ::pause();
  }));
  ::close(fds[1]);
  pollfd pfd{fds[0], POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 30000), 1) << "the writer never reached the middle of its write";
  char c;
  ASSERT_EQ(::read(fds[0], &c, 1), 1);
  ::close(fds[0]);
  ASSERT_EQ(::kill(child.pid(), SIGKILL), 0);
  int status = child.wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  SnapshotSegment r = SnapshotSegment::open(name(), false);
  EXPECT_EQ(r.sequence(1), 0) << "the killed write left its slot uncommitted";
  std::optional<SnapshotSegment::View> v = r.latest();
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->slot, 0);
  EXPECT_EQ(v->meta.step, 100);
  EXPECT_EQ(v->meta.sequence, 1);
  EXPECT_TRUE(r.corrupt_blocks(*v).empty());
  EXPECT_TRUE(holds(v->payload, 100, bytes));

  // The next writer overwrites the abandoned slot, never the snapshot.
  SnapshotSegment w = SnapshotSegment::open(name(), true);
  SnapshotMeta m = write(w, 300, bytes);
  EXPECT_EQ(m.sequence, 2);
  EXPECT_EQ(r.latest()->slot, 1);
  EXPECT_EQ(r.latest()->meta.step, 300);
  EXPECT_TRUE(holds(r.slot(0)->payload, 100, bytes));
}

// The kill lands anywhere: a child commits snapshots in a loop and is killed after a random
// delay, ten times over. Whatever was newest committed is whole and matches its step.
TEST_F(SnapshotSegmentTest, WriterKilledAtRandomPointsNeverTearsTheSnapshot) {
  const int64_t bytes = 3 * kMiB + 77;
  { SnapshotSegment s = SnapshotSegment::create(name(), bytes, ::getpid()); }
  std::mt19937 rng(1234);
  const std::string seg = name();
  int64_t last_step = 0, kills_mid_write = 0;
  for (int round = 0; round < 10; ++round) {
    Child child(fork_child([&] {
      SnapshotSegment w = SnapshotSegment::open(seg, true);
      std::optional<SnapshotSegment::View> v = w.latest();
      for (int64_t step = v ? v->meta.step + 1 : 1;; ++step) write(w, step, bytes);
      return 0;
    }));
    std::this_thread::sleep_for(std::chrono::microseconds(5000 + rng() % 35000));
    ASSERT_EQ(::kill(child.pid(), SIGKILL), 0);
    child.wait();
    SnapshotSegment r = SnapshotSegment::open(seg, false);
    std::optional<SnapshotSegment::View> v = r.latest();
    if (!v) continue;  // killed before the first commit
    EXPECT_GE(v->meta.step, last_step) << "round " << round;
    last_step = v->meta.step;
    EXPECT_TRUE(r.corrupt_blocks(*v).empty()) << "round " << round;
    EXPECT_TRUE(holds(v->payload, v->meta.step, bytes)) << "round " << round;
    kills_mid_write += r.sequence(1 - v->slot) == 0;
  }
  EXPECT_GT(last_step, 0) << "no snapshot was ever committed";
  // Each write is most of the time between commits, so some kill landed inside one.
  EXPECT_GT(kills_mid_write, 0);
}

TEST_F(SnapshotSegmentTest, AFlippedByteIsFoundAtItsBlock) {
  const int64_t bytes = 3 * kMiB + kMiB / 2;  // blocks 0..3, the last one short
  SnapshotSegment s = SnapshotSegment::create(name(), 4 * kMiB, ::getpid());
  write(s, 5, bytes);
  SnapshotSegment r = SnapshotSegment::open(name(), false);
  std::optional<SnapshotSegment::View> v = r.latest();
  ASSERT_TRUE(v.has_value());
  ASSERT_EQ(r.block_crc32c(*v).size(), 4u);
  EXPECT_EQ(r.block_crc32c(*v)[0], crc32c(v->payload, size_t(kMiB)));
  EXPECT_TRUE(r.corrupt_blocks(*v).empty());
  // Flip through the writable mapping, as a bad DIMM or a stray write would.
  auto* p = static_cast<uint8_t*>(const_cast<void*>(s.latest()->payload));
  p[2 * kMiB + 12345] ^= 0x40;
  EXPECT_EQ(r.corrupt_blocks(*v), std::vector<int64_t>{2});
  p[bytes - 1] ^= 0x01;
  EXPECT_EQ(r.corrupt_blocks(*v), (std::vector<int64_t>{2, 3}));
  p[2 * kMiB + 12345] ^= 0x40;
  p[bytes - 1] ^= 0x01;
  EXPECT_TRUE(r.corrupt_blocks(*v).empty());
  // A writer whose checksums do not match what it wrote is caught the same way.
  void* q = s.begin(meta(6, bytes));
  fill(q, 6, 0, bytes);
  std::vector<uint32_t> wrong(4, 0);
  s.commit(wrong);
  EXPECT_EQ(r.corrupt_blocks(*r.latest()), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST_F(SnapshotSegmentTest, OpeningAMissingOrForeignSegmentFailsNamingIt) {
  try {
    SnapshotSegment::open(name(), false);
    ADD_FAILURE() << "opened a missing segment";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(name()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  // A segment with the right name and someone else's bytes.
  auto make = [](const std::string& n, const std::string& bytes) {
    int fd = ::shm_open(n.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0) << n;
    ASSERT_EQ(::ftruncate(fd, 8192), 0);
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
    ::close(fd);
  };
  make(name(1), "not a snapshot, just some bytes");
  try {
    SnapshotSegment::open(name(1), false);
    ADD_FAILURE() << "opened a foreign segment";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(name(1)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a weft snapshot segment"), std::string::npos)
        << e.what();
  }
  // The right magic, a future version.
  std::string future(16, '\0');
  std::memcpy(future.data(), "WEFTSNAP", 8);
  future[8] = 9;
  make(name(2), future);
  try {
    SnapshotSegment::open(name(2), true);
    ADD_FAILURE() << "opened a segment of format version 9";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("version 9"), std::string::npos) << e.what();
  }
  // Empty (a create() killed before it sized the segment).
  int fd = ::shm_open(name(3).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  try {
    SnapshotSegment::open(name(3), false);
    ADD_FAILURE() << "opened an empty segment";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(name(3)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("too short"), std::string::npos) << e.what();
  }
}

TEST_F(SnapshotSegmentTest, CreatingAnExistingSegmentFailsAndKeepsIt) {
  SnapshotSegment s = SnapshotSegment::create(name(), kMiB, ::getpid());
  write(s, 9, 1000);
  try {
    SnapshotSegment::create(name(), 2 * kMiB, ::getpid());
    ADD_FAILURE() << "created a segment twice";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(name()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  SnapshotSegment r = SnapshotSegment::open(name(), false);
  EXPECT_EQ(r.capacity(), kMiB);
  EXPECT_EQ(r.latest()->meta.step, 9);
  EXPECT_TRUE(holds(r.latest()->payload, 9, 1000));
}

TEST_F(SnapshotSegmentTest, AFullShmFailsAtCreateNotLater) {
  struct statvfs fs {};
  ASSERT_EQ(::statvfs("/dev/shm", &fs), 0);
  if (fs.f_blocks == 0) GTEST_SKIP() << "/dev/shm has no size limit";
  const int64_t more_than_all = int64_t(fs.f_blocks) * int64_t(fs.f_frsize) + 1024 * kMiB;
  try {
    SnapshotSegment::create(name(), more_than_all, ::getpid());
    ADD_FAILURE() << "created a segment larger than /dev/shm";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(name()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/dev/shm"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(snapshot_segments(job_).empty()) << "a failed create left its segment behind";
}

TEST_F(SnapshotSegmentTest, MisuseIsAnInternalError) {
  SnapshotSegment s = SnapshotSegment::create(name(), kMiB, ::getpid());
  write(s, 1, kMiB);
  EXPECT_THROW(s.commit(), InternalError);  // no begin()
  EXPECT_THROW(s.begin(meta(2, kMiB + 1)), InternalError);
  EXPECT_THROW(s.begin(meta(2, -1)), InternalError);
  SnapshotMeta bad_job = meta(2, 10);
  bad_job.job_id = "not-a-job";
  EXPECT_THROW(s.begin(bad_job), InternalError);
  s.begin(meta(2, 3 * 1000));
  EXPECT_THROW(s.commit(std::vector<uint32_t>(2, 0)), InternalError);  // 1 block, 2 crcs
  SnapshotSegment r = SnapshotSegment::open(name(), false);
  EXPECT_THROW(r.begin(meta(3, 10)), InternalError);  // read-only
  EXPECT_THROW(r.set_owner(1, 0), InternalError);
  EXPECT_THROW(SnapshotSegment::create(name(1), -1, ::getpid()), InternalError);
  // None of that disturbed the snapshot.
  EXPECT_EQ(r.latest()->meta.step, 1);
  EXPECT_TRUE(holds(r.latest()->payload, 1, kMiB));
}

TEST_F(SnapshotSegmentTest, NamesListAndFilterByJob) {
  EXPECT_EQ(segment_name(job_, SegmentKind::kData, 0, 2, 3), "/weft-snap-" + job_ + "-d0-e2-r3");
  EXPECT_EQ(segment_name(job_, SegmentKind::kReplica, 4, 10, 11),
            "/weft-snap-" + job_ + "-r4-e10-r11");
  EXPECT_EQ(segment_name(job_, SegmentKind::kParity, 1, 0, 0), "/weft-snap-" + job_ + "-p1-e0-r0");
  EXPECT_THROW(segment_name("XYZ", SegmentKind::kData, 0, 0, 0), InternalError);
  EXPECT_THROW(segment_name(job_, SegmentKind::kData, -1, 0, 0), InternalError);

  std::optional<SegmentName> p =
      parse_segment_name(segment_name(job_, SegmentKind::kReplica, 4, 10, 11));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->job_id, job_);
  EXPECT_EQ(p->kind, SegmentKind::kReplica);
  EXPECT_EQ(p->owner_node, 4);
  EXPECT_EQ(p->epoch, 10);
  EXPECT_EQ(p->rank, 11);
  for (const std::string& bad :
       {std::string("/weft-snap-"), "/weft-snap-" + job_ + "-d0-e2-r3x",
        "/weft-snap-" + job_ + "-q0-e2-r3", "/weft-snap-" + job_ + "-d0-e-r3",
        "/weft-shm-" + job_ + "-d0-e2-r3", "/weft-snap-" + job_})
    EXPECT_FALSE(parse_segment_name(bad).has_value()) << bad;

  const std::string other = new_job_id();
  std::vector<std::string> mine = {segment_name(job_, SegmentKind::kData, 0, 1, 1),
                                   segment_name(job_, SegmentKind::kParity, 2, 1, 0)};
  std::string theirs = segment_name(other, SegmentKind::kData, 0, 1, 0);
  for (const std::string& n : mine) SnapshotSegment::create(n, 1, ::getpid());
  try {
    SnapshotSegment::create(theirs, 1, ::getpid());
    std::sort(mine.begin(), mine.end());
    EXPECT_EQ(snapshot_segments(job_), mine);
    EXPECT_EQ(snapshot_segments(other), std::vector<std::string>{theirs});
    std::vector<std::string> all = snapshot_segments();
    EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
    for (const std::string& n : mine)
      EXPECT_NE(std::find(all.begin(), all.end(), n), all.end()) << n;
    EXPECT_NE(std::find(all.begin(), all.end(), theirs), all.end());
  } catch (...) {
    SnapshotSegment::unlink(theirs);
    throw;
  }
  SnapshotSegment::unlink(theirs);
}

TEST_F(SnapshotSegmentTest, OwnerGoneIsTheOwnerProcessGone) {
  SnapshotSegment s = SnapshotSegment::create(name(), 1, ::getpid());
  EXPECT_FALSE(s.owner_gone());
  Child exited(fork_child([] { return 0; }));
  pid_t dead = exited.pid();
  exited.wait();
  s.set_owner(dead, 0);
  EXPECT_EQ(SnapshotSegment::open(name(), false).owner_pid(), dead);
  EXPECT_TRUE(SnapshotSegment::open(name(), false).owner_gone());
  // A zombie (exited, not reaped) is gone as well.
  Child zombie(fork_child([] { return 0; }));
  for (int i = 0; i < 5000 && ::kill(zombie.pid(), 0) == 0; ++i) {
    std::ifstream f("/proc/" + std::to_string(zombie.pid()) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (stat.find(") Z") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  s.set_owner(zombie.pid(), 0);
  EXPECT_TRUE(s.owner_gone());
  zombie.wait();
  s.set_owner(::getpid(), 0);
  EXPECT_FALSE(s.owner_gone());
}

// Abandoned means the owner and its guardian (the weft run that restarts the owner) are both
// gone: a dead owner whose guardian lives is about to be restarted. No guardian recorded:
// the owner alone decides, as before version 3.
TEST_F(SnapshotSegmentTest, AbandonedOnlyOnceOwnerAndGuardianAreGone) {
  Child exited(fork_child([] { return 0; }));
  const pid_t dead = exited.pid();
  exited.wait();
  SnapshotSegment s = SnapshotSegment::create(name(), 1, dead, kMinSnapshotSlots, ::getpid());
  EXPECT_EQ(s.version(), int(kSnapshotFormatVersion));
  SnapshotSegment r = SnapshotSegment::open(name(), false);
  EXPECT_EQ(r.owner_pid(), dead);
  EXPECT_EQ(r.guardian_pid(), ::getpid());
  EXPECT_TRUE(r.owner_gone());
  EXPECT_FALSE(r.guardian_gone());
  EXPECT_FALSE(r.abandoned()) << "its guardian lives: the owner is about to be restarted";
  s.set_owner(dead, dead);
  EXPECT_TRUE(r.guardian_gone());
  EXPECT_TRUE(r.abandoned());
  s.set_owner(dead, 0);
  EXPECT_EQ(r.guardian_pid(), 0);
  EXPECT_TRUE(r.guardian_gone()) << "none recorded";
  EXPECT_TRUE(r.abandoned());
  s.set_owner(::getpid(), dead);
  EXPECT_FALSE(r.abandoned()) << "its owner lives";
}

// A version-2 segment (a weft before guardians made it) opens with no guardian, so it is
// judged by its owner alone; an agent that takes it over makes it version 3, guardian
// recorded, its snapshot untouched.
TEST_F(SnapshotSegmentTest, AVersionTwoSegmentHasNoGuardianUntilTakenOver) {
  Child exited(fork_child([] { return 0; }));
  const pid_t dead = exited.pid();
  exited.wait();
  {
    SnapshotSegment s = SnapshotSegment::create(name(), kMiB, dead, 3);
    write(s, 5, 700);
  }
  const int fd = ::shm_open(name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  const uint32_t two = 2;
  ASSERT_EQ(::pwrite(fd, &two, sizeof two, 8), ssize_t(sizeof two));  // version
  ::close(fd);
  SnapshotSegment old = SnapshotSegment::open(name(), true);
  EXPECT_EQ(old.version(), 2);
  EXPECT_EQ(old.slots(), 3);
  EXPECT_EQ(old.guardian_pid(), 0) << "version 2 has no guardian field";
  EXPECT_TRUE(old.abandoned()) << "owner gone, no guardian: abandoned, as version 2 judged";
  old.set_owner(::getpid(), ::getpid());
  EXPECT_EQ(old.version(), int(kSnapshotFormatVersion));
  SnapshotSegment r = SnapshotSegment::open(name(), false);
  EXPECT_EQ(r.version(), int(kSnapshotFormatVersion));
  EXPECT_EQ(r.slots(), 3);
  EXPECT_EQ(r.guardian_pid(), ::getpid());
  EXPECT_FALSE(r.abandoned());
  EXPECT_EQ(r.latest()->meta.step, 5);
  EXPECT_TRUE(holds(r.latest()->payload, 5, 700));
}

TEST(SnapshotLayoutHash, StableAndSensitiveToEveryBox) {
  std::vector<BoxKey> a = {{0, {0, 0}, {64, 32}}, {1, {0}, {128}}, {5, {16, 0}, {16, 64}}};
  EXPECT_EQ(layout_hash(a), layout_hash(a));
  // Pinned: the hash is part of the in-memory format; a change would refuse every snapshot.
  // FNV-1a 64 of "weft-layout-v1|0:0,0,:64,32,|1:0,:128,|5:16,0,:16,64," (checked in Python).
  EXPECT_EQ(layout_hash(a), 0x315ba6017f1b0e8eu) << std::hex << layout_hash(a);
  std::vector<BoxKey> reordered = {a[1], a[0], a[2]};
  EXPECT_NE(layout_hash(reordered), layout_hash(a));
  std::vector<BoxKey> other_state = a;
  other_state[2].state = 6;
  EXPECT_NE(layout_hash(other_state), layout_hash(a));
  std::vector<BoxKey> other_extent = a;
  other_extent[0].extent[1] = 31;
  EXPECT_NE(layout_hash(other_extent), layout_hash(a));
  // The same numbers split differently between start and extent.
  EXPECT_NE(layout_hash({{0, {1, 2}, {3}}}), layout_hash({{0, {1}, {2, 3}}}));
  EXPECT_NE(layout_hash({}), layout_hash({{0, {}, {}}}));
}

}  // namespace
}  // namespace weft::checkpoint
