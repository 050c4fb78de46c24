// In-memory snapshots, the storage: one POSIX shared-memory segment per snapshotted rank,
// double-buffered so that one complete snapshot always exists while the next is written
// (issue 15; REFT's and Gemini's host-memory snapshots). The node's snapshot agent
// (launch/snapshot_agent.h) creates and owns the segments, so a trainer crash, or a kill -9
// of every worker on the node, loses nothing; a worker maps its segment and writes into it.
//
// A segment is a header page, then two slots (three for a job whose snapshots are copied to
// other nodes: docs/snapshot-format.md, "Why the steps meet"). A slot is a header (what it
// holds: job, epoch, step, rank, world, layout hash, payload bytes, one crc32c per
// kSnapshotBlockBytes block) followed by the payload: the rank's VPS tensors in
// layout_of(...).locals order, each dense and row-major, packed back to back (so the reader,
// who knows the layout, can slice it without a table). A slot's `sequence` is written
// last, with release ordering, after every payload byte and checksum; 0 means "being
// written" and is what a writer stores first. The newest committed slot (highest sequence) is the
// snapshot; a writer always writes into another one (an uncommitted one, else the oldest). A kill
// at any point therefore leaves the previous snapshot intact and readable.
//
// Segment kinds: kData (a rank's own snapshot, on its node), kReplica (a copy of another
// node's rank, pushed by that node's agent), kParity (one parity fragment of an erasure-coded
// stripe: launch/snapshot_parity.h), kRebuilt (a lost rank's snapshot decoded from parity).
// The same header describes all four; `owner_node`/`rank` say whose data it is (for kParity:
// the node holding it and the stripe's number).
//
// Names: "/weft-snap-<job id>-<kind letter><owner node>-e<epoch>-r<rank>" (d, r, p, b), e.g.
// "/weft-snap-0123456789abcdef-d0-e2-r3": a new world (epoch) gets new segments, and the
// agent removes a rank's older ones only once the newer one has committed, so a resize
// never leaves a node without a complete snapshot. snapshot_segments() lists them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace weft::checkpoint {

inline constexpr int64_t kSnapshotBlockBytes = int64_t(1) << 20;  // crc32c granularity
inline constexpr int kMinSnapshotSlots = 2, kMaxSnapshotSlots = 4;
// The segment format this build writes; it reads versions 1 up to it (docs/snapshot-format.md).
inline constexpr uint32_t kSnapshotFormatVersion = 3;

enum class SegmentKind : uint32_t { kData = 1, kReplica = 2, kParity = 3, kRebuilt = 4 };

// What a committed slot holds. `sequence` > 0 for committed slots.
struct SnapshotMeta {
  std::string job_id;        // 16 hex digits (checkpoint/job_id.h)
  SegmentKind kind = SegmentKind::kData;
  int owner_node = 0;        // the node index (membership order) whose rank this is
  int64_t epoch = 0;         // membership epoch of the world the state was trained in
  int64_t step = 0;          // optimizer steps done: the state before step `step`
  int rank = -1, world = 0;  // the rank's place in that world
  uint64_t layout_hash = 0;  // of the rank's boxes (layout_hash() below); refuses a misread
  int64_t payload_bytes = 0;
  int64_t sequence = 0;      // increases with every commit into this segment
};

// A hash of a rank's boxes: every (state index, start, extent) in locals order. Two layouts
// that give the rank the same boxes in the same order hash equal.
struct BoxKey {
  int state = -1;
  std::vector<int64_t> start, extent;
};
uint64_t layout_hash(const std::vector<BoxKey>& boxes);

// A mapped segment. Movable, not copyable; the destructor unmaps (never unlinks).
// Not thread-safe: one writer; readers in other processes see only committed slots.
class SnapshotSegment {
 public:
  // Creates (O_EXCL) and sizes a segment of `slots` slots (kMinSnapshotSlots..kMax) for
  // payloads of up to `capacity` bytes per slot, every slot empty. Its memory is allocated here
  // (posix_fallocate), so a full /dev/shm fails now, not with a SIGBUS at the first write. IoError
  // naming the segment on failure (it exists, /dev/shm is full: then nothing is left behind). The
  // agent calls this; `owner_pid` (the agent) and `guardian_pid` (the process that restarts the
  // agent when it dies, weft run; 0: none) are recorded so that other agents and `weft snapshot
  // clean` can tell an abandoned segment (both gone: abandoned()) from a live one.
  // `allocate_slots` false: only the headers are allocated here, and a writer allocates each
  // slot's payload as it writes it (populate_writing, which fails as clearly): a segment
  // written once (an agent's rebuild) then costs one slot of memory and one pass over it,
  // not all of its slots' at create and a page fault per page at the write.
  static SnapshotSegment create(const std::string& name, int64_t capacity, int owner_pid,
                                int slots = kMinSnapshotSlots, int guardian_pid = 0,
                                bool allocate_slots = true);
  // Maps an existing segment, read-write when `writable`. IoError naming it when it does not
  // exist, is too short, or its header is not a snapshot segment's (magic, version).
  // Maps nothing in yet: a reader of one slot asks for its pages (populate below).
  static SnapshotSegment open(const std::string& name, bool writable);
  // Removes the name (mapped views stay valid until unmapped). No error when already gone.
  static void unlink(const std::string& name);
  // Gives this segment the name `to` (a shared-memory name that must not exist yet), keeping
  // its memory and every mapping of it: a segment made ahead under the name it was expected
  // to need is renamed when another one turns out to be needed (a rebuild target made ahead,
  // launch/snapshot_parity.h). IoError naming both when `to` exists or the rename fails.
  void rename(const std::string& to);

  SnapshotSegment(SnapshotSegment&&) noexcept;
  SnapshotSegment& operator=(SnapshotSegment&&) noexcept;
  SnapshotSegment(const SnapshotSegment&) = delete;
  SnapshotSegment& operator=(const SnapshotSegment&) = delete;
  ~SnapshotSegment();

  const std::string& name() const { return name_; }
  int64_t capacity() const;  // payload bytes per slot
  int slots() const { return slots_; }
  int owner_pid() const;
  // True when the owner process is known to be gone: no process has its pid (or it is a
  // zombie) in the pid namespace that created the segment. False while it lives, and when
  // that cannot be told (the segment was made in another pid namespace): never a guess.
  bool owner_gone() const;
  // The guardian: the process that restarts a dead owner (weft run, for its node's agent),
  // recorded by format version 3; 0 when none was recorded (versions 1 and 2 have none).
  int guardian_pid() const;
  // True when no guardian was recorded or it is known to be gone (as owner_gone()).
  bool guardian_gone() const;
  // Whether the recorded guardian is process `pid` of this pid namespace (never for pid <= 0):
  // a restarted agent knows its node's segments by their guardian, whatever index named them.
  bool guarded_by(int pid) const;
  // Abandoned: its owner is gone and so is its guardian, so nobody will write it again. An
  // owner that is dead while its guardian lives is about to be restarted and to adopt the
  // segment: that one is not abandoned (another job's agent starting meanwhile keeps it).
  bool abandoned() const;
  // A restarted agent takes over the segments its predecessor left (writable views only):
  // it records itself and its guardian. A segment of an older format version is rewritten
  // as the current one (its header has room: the new fields were zeros).
  void set_owner(int pid, int guardian_pid);
  int version() const { return version_; }  // the segment's format version

  // Writing. begin() picks a slot that is not the newest committed one, marks it
  // uncommitted (sequence 0) and returns its payload (capacity() bytes, writable until
  // commit). The caller fills `meta.payload_bytes` bytes of it, in any order, from any one
  // thread; commit() computes the block checksums (or takes them from `block_crc32c` when
  // the writer computed them while copying: one per kSnapshotBlockBytes block, the last may
  // be short) and publishes the slot with the next sequence. InternalError when the payload
  // exceeds capacity(), meta.job_id is not a job id (valid_job_id), the view is read-only,
  // begin() was not called, or `block_crc32c` has the wrong count.
  void* begin(const SnapshotMeta& meta);
  // After begin(): allocates and maps in the pages of bytes [from, from + bytes) of the slot
  // being written (posix_fallocate, then MADV_POPULATE_WRITE), so that its writes take no
  // page fault and a full
  // /dev/shm is an IoError naming the segment now, not a SIGBUS at a write. A writer may
  // populate piece by piece, each before it writes there.
  void populate_writing(int64_t from, int64_t bytes);
  // Allocates every slot's pages (posix_fallocate of the whole segment; the allocated ones
  // cost a look): what create() with `allocate_slots` does, from any process that has the
  // segment open for writing. IoError naming the segment and /dev/shm when it is full.
  void allocate_slots();
  SnapshotMeta commit(const std::vector<uint32_t>& block_crc32c = {});

  // Reading: the newest committed slot, if any, and its payload (valid while this object
  // lives and no writer reuses that slot: a reader that must outlive the next commit copies
  // the bytes or checks sequence() again afterwards).
  struct View {
    SnapshotMeta meta;
    const void* payload = nullptr;
    int slot = 0;
  };
  std::optional<View> latest() const;
  // Slot `slot` (0 .. slots() - 1) when it holds a committed snapshot (`weft snapshot
  // verify` checks each). IoError naming the segment when a committed slot's header is inconsistent
  // (payload beyond capacity, a block count that does not match): latest() throws it too.
  std::optional<View> slot(int slot) const;
  // The sequence of `slot` now (0 while being written): a reader compares it with
  // View::meta.sequence after reading to know the slot was not rewritten meanwhile.
  int64_t sequence(int slot) const;
  // Recomputes the block checksums of a view; the indices of the blocks that differ from
  // the recorded ones (empty: intact).
  std::vector<int64_t> corrupt_blocks(const View& v) const;
  std::vector<uint32_t> block_crc32c(const View& v) const;  // as recorded
  // Maps the pages of a view's payload now (MADV_POPULATE_READ, in pieces that let the
  // process's other threads map and fault meanwhile: base/populate.h), for a reader of all
  // of it (a restore): a few calls instead of a fault per 4 KiB page, about half the time of faulting
  // a GiB in here. Only the view's, never the whole segment: a slot never written holds
  // pages that create() allocated and the first mapping zeroes, and a slot of another step
  // may not be read at all. Populating whole 3-slot segments (2 GB per survivor, 1.2 GB of
  // it never written) held a node-loss recovery 2.5 s (issue 15). A kernel without
  // MADV_POPULATE_READ (before 5.14) leaves the pages to fault in as they are read.
  void populate(const View& v) const;

 private:
  SnapshotSegment() = default;
  std::string name_;
  void* base_ = nullptr;
  int64_t mapped_bytes_ = 0;
  bool writable_ = false;
  int writing_ = -1;  // the slot begin() handed out, until commit()
  int slots_ = kMinSnapshotSlots;
  int version_ = 0;  // the header's format version when mapped (set_owner may raise it)
};

// Segment names of one job (or every job when `job_id` is empty), from /dev/shm, sorted.
std::vector<std::string> snapshot_segments(const std::string& job_id = {});
// The segment name for a kind, owner node, epoch and rank of a job. InternalError unless
// `job_id` is 16 lowercase hex digits and the numbers are >= 0.
std::string segment_name(const std::string& job_id, SegmentKind kind, int owner_node, int64_t epoch,
                         int rank);
// What a segment name says (the inverse of segment_name); nullopt for any other name.
struct SegmentName {
  std::string job_id;
  SegmentKind kind = SegmentKind::kData;
  int owner_node = 0;
  int64_t epoch = 0;
  int rank = 0;
};
std::optional<SegmentName> parse_segment_name(const std::string& name);
// A job id as segment names take it: 16 lowercase hex digits.
bool valid_job_id(const std::string& job_id);

}  // namespace weft::checkpoint
