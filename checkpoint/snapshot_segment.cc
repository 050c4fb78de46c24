// The snapshot segment: its byte layout in shared memory, creation (allocated up front), the
// seqlock-style commit protocol of its slots (two, or three), and segment names.
// docs/snapshot-format.md describes the layout and why a kill at any point leaves a complete
// snapshot.
#include "checkpoint/snapshot_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <type_traits>
#include <utility>

#include "base/check.h"
#include "base/error.h"
#include "base/populate.h"
#include "checkpoint/crc32c.h"
#include "core/rng.h"

namespace weft::checkpoint {

namespace {

constexpr uint64_t kMagic = 0x50414e5354464557;  // "WEFTSNAP" in little-endian bytes
// Version 2 records the slot count (`slots`); version 1 had two slots and zeros there.
// Version 3 records the guardian (guardian_pid, guardian_pidns); versions 1 and 2 have
// zeros there (the header page past their fields): no guardian, judged by the owner alone.
constexpr uint32_t kVersion = kSnapshotFormatVersion;
constexpr int64_t kMinPage = 4096;
constexpr const char* kShmDir = "/dev/shm";
constexpr const char* kPrefix = "weft-snap-";

// Offset 0: what the whole segment is. Written once at create(), magic last; afterwards
// only the owner and guardian fields change (set_owner), and the version of an older
// segment a new owner takes (it then records a guardian).
struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t page_bytes;        // alignment of slots and payloads; the header page's size
  int64_t owner_pid;          // the agent that created (or took over) the segment
  uint64_t owner_pidns;       // inode of its /proc/self/ns/pid (0: unknown)
  int64_t capacity;           // payload bytes per slot
  int64_t table_entries;      // crc32c entries per slot: capacity / kSnapshotBlockBytes, up
  int64_t slot_header_bytes;  // SlotHeader + crc table, rounded up to page_bytes
  int64_t slot_bytes;         // slot_header_bytes + capacity rounded up to page_bytes
  int64_t total_bytes;        // page_bytes + slots * slot_bytes
  int64_t slots;              // kMinSnapshotSlots..kMaxSnapshotSlots (0 in version 1: two)
  int64_t guardian_pid;       // the process that restarts the owner (weft run); 0: none
  uint64_t guardian_pidns;    // inode of the recorder's /proc/self/ns/pid (0: unknown)
};

// Offset page_bytes + slot * slot_bytes; the crc table follows it, the payload starts at
// slot_header_bytes. `sequence` is the commit word: 0 while written, stored last.
struct SlotHeader {
  int64_t sequence;
  char job_id[32];  // 16 hex digits, NUL-terminated
  uint32_t kind;
  int32_t owner_node;
  int64_t epoch, step;
  int32_t rank, world;
  uint64_t layout_hash;
  int64_t payload_bytes;
  int64_t block_count;
  // uint32_t crc32c[table_entries];
};
static_assert(std::is_standard_layout_v<SegmentHeader> && sizeof(SegmentHeader) == 96);
static_assert(std::is_standard_layout_v<SlotHeader> && sizeof(SlotHeader) == 96);
static_assert(offsetof(SlotHeader, sequence) == 0);
// The commit word is shared between processes: it must never fall back to a lock.
static_assert(std::atomic_ref<int64_t>::is_always_lock_free);

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }
int64_t blocks_for(int64_t bytes) {
  return (bytes + kSnapshotBlockBytes - 1) / kSnapshotBlockBytes;
}

SegmentHeader geometry(int64_t capacity, int64_t page, int64_t slots) {
  SegmentHeader h{};
  h.slots = slots;
  h.page_bytes = uint32_t(page);
  h.capacity = capacity;
  h.table_entries = blocks_for(capacity);
  h.slot_header_bytes =
      round_up(int64_t(sizeof(SlotHeader)) + h.table_entries * int64_t(sizeof(uint32_t)), page);
  h.slot_bytes = h.slot_header_bytes + round_up(capacity, page);
  h.total_bytes = page + slots * h.slot_bytes;
  return h;
}

uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? uint64_t(st.st_ino) : 0;
}

// Whether process `pid`, recorded in pid namespace `pidns`, is known to be gone: no process
// has that pid here, or it is a zombie (exited, not yet reaped: it never acts again). False
// while it lives and when that cannot be told (recorded in another pid namespace). A pid
// reused by an unrelated process reads as alive: the error keeps a segment, never loses one.
bool pid_gone(int64_t recorded, uint64_t pidns) {
  const pid_t pid = pid_t(recorded);
  const uint64_t here = pid_namespace();
  if (pid <= 0 || (pidns && here && pidns != here)) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() &&
         (s[close + 2] == 'Z' || s[close + 2] == 'X');
}

// The pieces of a mapped segment.
SegmentHeader* header(void* base) { return static_cast<SegmentHeader*>(base); }
char* slot_base(void* base, int slot) {
  const SegmentHeader* h = header(base);
  return static_cast<char*>(base) + h->page_bytes + slot * h->slot_bytes;
}
SlotHeader* slot_header(void* base, int slot) {
  return reinterpret_cast<SlotHeader*>(slot_base(base, slot));
}
uint32_t* crc_table(void* base, int slot) {
  return reinterpret_cast<uint32_t*>(slot_base(base, slot) + sizeof(SlotHeader));
}
char* payload(void* base, int slot) {
  return slot_base(base, slot) + header(base)->slot_header_bytes;
}
std::atomic_ref<int64_t> sequence_word(void* base, int slot) {
  return std::atomic_ref<int64_t>(slot_header(base, slot)->sequence);
}

// Why a mapped file is not a snapshot segment this build reads ("" when it is one). `h` is a
// copy, its slot count made explicit for version 1 (two).
std::string header_problem(SegmentHeader& h, int64_t file_bytes) {
  if (h.magic != kMagic) return "is not a weft snapshot segment (no WEFTSNAP magic)";
  if (h.version < 1 || h.version > kVersion)
    return str("has snapshot format version ", h.version, "; this weft reads versions 1 to ",
               kVersion, " (a newer weft made it: inspect or clean it with that weft)");
  if (h.version == 1) h.slots = 2;
  if (h.slots < kMinSnapshotSlots || h.slots > kMaxSnapshotSlots)
    return str("has an invalid header (", h.slots, " slots)");
  if (h.page_bytes < kMinPage || (h.page_bytes & (h.page_bytes - 1)) || h.page_bytes > (1u << 24) ||
      h.capacity < 0 || h.capacity > (int64_t(1) << 50))
    return str("has an invalid header (page ", h.page_bytes, ", capacity ", h.capacity, ")");
  SegmentHeader g = geometry(h.capacity, h.page_bytes, h.slots);
  if (g.table_entries != h.table_entries || g.slot_header_bytes != h.slot_header_bytes ||
      g.slot_bytes != h.slot_bytes || g.total_bytes != h.total_bytes)
    return "has an inconsistent header (its sizes do not follow from its capacity)";
  if (h.total_bytes > file_bytes)
    return str("is truncated: ", file_bytes, " bytes, its header says ", h.total_bytes);
  return "";
}

char kind_letter(SegmentKind k) {
  switch (k) {
    case SegmentKind::kData:
      return 'd';
    case SegmentKind::kReplica:
      return 'r';
    case SegmentKind::kParity:
      return 'p';
    case SegmentKind::kRebuilt:
      return 'b';
  }
  return '?';
}

bool valid_shm_name(const std::string& name) {
  return name.size() > 1 && name.size() < 250 && name[0] == '/' &&
         name.find('/', 1) == std::string::npos;
}

// Allocates the pages of bytes [offset, offset + bytes) of segment `name` through its file
// (posix_fallocate). IoError naming the segment and /dev/shm when it is full.
void allocate_range(const std::string& name, int64_t offset, int64_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  const int err = fd < 0 ? errno : ::posix_fallocate(fd, off_t(offset), off_t(bytes));
  if (fd >= 0) ::close(fd);
  if (err != 0)
    throw IoError(str("cannot allocate ", (bytes + (1 << 20) - 1) >> 20,
                      " MiB of snapshot segment ", name, " in ", kShmDir, ": ", std::strerror(err),
                      err == ENOSPC ? " (see `df -h /dev/shm`: free it, or snapshot less)" : ""));
}

}  // namespace

uint64_t layout_hash(const std::vector<BoxKey>& boxes) {
  // Text with separators, so that ({1,2},{3}) and ({1},{2,3}) cannot collide by construction.
  std::string key = "weft-layout-v1";
  for (const BoxKey& b : boxes) {
    key += '|';
    key += std::to_string(b.state);
    key += ':';
    for (int64_t s : b.start) (key += std::to_string(s)) += ',';
    key += ':';
    for (int64_t e : b.extent) (key += std::to_string(e)) += ',';
  }
  return core::stable_hash(key);
}

bool valid_job_id(const std::string& job_id) {
  return job_id.size() == 16 && std::all_of(job_id.begin(), job_id.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

SnapshotSegment SnapshotSegment::create(const std::string& name, int64_t capacity, int owner_pid,
                                        int slots, int guardian_pid, bool allocate_slots) {
  WEFT_CHECK(valid_shm_name(name), "a shared-memory name is '/' and a file name: '", name, "'");
  WEFT_CHECK(capacity >= 0, "snapshot segment ", name, ": capacity ", capacity, " < 0");
  WEFT_CHECK(slots >= kMinSnapshotSlots && slots <= kMaxSnapshotSlots, "snapshot segment ", name,
             ": ", slots, " slots");
  const int64_t page = std::max<int64_t>(kMinPage, ::sysconf(_SC_PAGESIZE));
  SegmentHeader g = geometry(capacity, page, slots);
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    int e = errno;
    if (e == EEXIST)
      throw IoError(str("snapshot segment ", name,
                        " already exists (`weft snapshot ls` shows it; `weft snapshot clean` "
                        "removes segments whose owner is gone)"));
    throw IoError(str("cannot create snapshot segment ", name, ": ", std::strerror(e)));
  }
  // Allocate every page now: tmpfs would otherwise hand out pages at first touch and kill
  // the writer with SIGBUS when /dev/shm runs out in the middle of a snapshot.
  // (Without allocate_slots: the header page and every slot's header and crc table; the
  // payloads as populate_writing() asks.)
  int err = ::ftruncate(fd, off_t(g.total_bytes)) != 0 ? errno : 0;
  if (!err && allocate_slots) err = ::posix_fallocate(fd, 0, off_t(g.total_bytes));
  if (!err && !allocate_slots) err = ::posix_fallocate(fd, 0, off_t(g.page_bytes));
  for (int64_t s = 0; !err && !allocate_slots && s < slots; ++s)
    err = ::posix_fallocate(fd, off_t(g.page_bytes + s * g.slot_bytes), off_t(g.slot_header_bytes));
  void* base = MAP_FAILED;
  if (!err) {
    base = ::mmap(nullptr, size_t(g.total_bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) err = errno;
  }
  ::close(fd);
  if (err) {
    ::shm_unlink(name.c_str());
    throw IoError(str("cannot allocate ", (g.total_bytes + (1 << 20) - 1) >> 20,
                      " MiB for snapshot segment ", name, " (", slots, " slots of ", capacity,
                      " bytes) in ", kShmDir, ": ", std::strerror(err),
                      err == ENOSPC ? " (see `df -h /dev/shm`: free it, or snapshot less)" : ""));
  }
  SegmentHeader* h = header(base);
  *h = g;
  h->version = kVersion;
  h->owner_pid = owner_pid;
  h->owner_pidns = pid_namespace();
  h->guardian_pid = std::max(guardian_pid, 0);
  h->guardian_pidns = h->owner_pidns;
  std::atomic_thread_fence(std::memory_order_release);
  std::atomic_ref<uint64_t>(h->magic).store(kMagic, std::memory_order_release);
  SnapshotSegment s;
  s.name_ = name;
  s.base_ = base;
  s.mapped_bytes_ = g.total_bytes;
  s.writable_ = true;
  s.slots_ = slots;
  s.version_ = int(kVersion);
  return s;
}

SnapshotSegment SnapshotSegment::open(const std::string& name, bool writable) {
  int fd = ::shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) {
    int e = errno;
    throw IoError(str("cannot open snapshot segment ", name, ": ",
                      e == ENOENT ? "it does not exist" : std::strerror(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < off_t(sizeof(SegmentHeader))) {
    int64_t size = st.st_size;
    ::close(fd);
    throw IoError(str("snapshot segment ", name, " is too short (", size,
                      " bytes) to be a weft snapshot segment"));
  }
  int prot = PROT_READ | (writable ? PROT_WRITE : 0);
  void* base = ::mmap(nullptr, size_t(st.st_size), prot, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);
  if (base == MAP_FAILED)
    throw IoError(str("cannot map snapshot segment ", name, ": ", std::strerror(e)));
  SegmentHeader h = *header(base);
  h.magic = std::atomic_ref<uint64_t>(header(base)->magic).load(std::memory_order_acquire);
  std::string problem = header_problem(h, st.st_size);
  if (!problem.empty()) {
    ::munmap(base, size_t(st.st_size));
    throw IoError(str("segment ", name, " ", problem));
  }
  SnapshotSegment s;
  s.name_ = name;
  s.base_ = base;
  s.mapped_bytes_ = st.st_size;
  s.writable_ = writable;
  s.slots_ = int(h.slots);
  s.version_ = int(h.version);
  return s;
}

void SnapshotSegment::unlink(const std::string& name) {
  if (::shm_unlink(name.c_str()) != 0 && errno != ENOENT)
    throw IoError(str("cannot remove snapshot segment ", name, ": ", std::strerror(errno)));
}

void SnapshotSegment::rename(const std::string& to) {
  WEFT_CHECK(base_, "rename of a snapshot segment that is not mapped");
  WEFT_CHECK(valid_shm_name(to), "a shared-memory name is '/' and a file name: '", to, "'");
  if (to == name_) return;
  // shm_open's names are files of kShmDir; RENAME_NOREPLACE: never over another segment.
  const std::string from_path = kShmDir + name_, to_path = kShmDir + to;
  if (::renameat2(AT_FDCWD, from_path.c_str(), AT_FDCWD, to_path.c_str(), RENAME_NOREPLACE) != 0)
    throw IoError(str("cannot rename snapshot segment ", name_, " to ", to, ": ",
                      std::strerror(errno)));
  name_ = to;
}

SnapshotSegment::SnapshotSegment(SnapshotSegment&& o) noexcept
    : name_(std::move(o.name_)),
      base_(std::exchange(o.base_, nullptr)),
      mapped_bytes_(std::exchange(o.mapped_bytes_, 0)),
      writable_(o.writable_),
      writing_(std::exchange(o.writing_, -1)),
      slots_(o.slots_),
      version_(o.version_) {}

SnapshotSegment& SnapshotSegment::operator=(SnapshotSegment&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, size_t(mapped_bytes_));
    name_ = std::move(o.name_);
    base_ = std::exchange(o.base_, nullptr);
    mapped_bytes_ = std::exchange(o.mapped_bytes_, 0);
    writable_ = o.writable_;
    writing_ = std::exchange(o.writing_, -1);
    slots_ = o.slots_;
    version_ = o.version_;
  }
  return *this;
}

SnapshotSegment::~SnapshotSegment() {
  if (base_) ::munmap(base_, size_t(mapped_bytes_));
}

int64_t SnapshotSegment::capacity() const { return header(base_)->capacity; }
int SnapshotSegment::owner_pid() const { return int(header(base_)->owner_pid); }

bool SnapshotSegment::owner_gone() const {
  const SegmentHeader* h = header(base_);
  return pid_gone(h->owner_pid, h->owner_pidns);
}

int SnapshotSegment::guardian_pid() const {
  return version_ >= 3 ? int(header(base_)->guardian_pid) : 0;
}

bool SnapshotSegment::guardian_gone() const {
  const SegmentHeader* h = header(base_);
  if (guardian_pid() <= 0) return true;  // none recorded: nobody will restart the owner
  return pid_gone(h->guardian_pid, h->guardian_pidns);
}

bool SnapshotSegment::guarded_by(int pid) const {
  const SegmentHeader* h = header(base_);
  const uint64_t here = pid_namespace();
  return pid > 0 && guardian_pid() == pid &&
         (h->guardian_pidns == 0 || here == 0 || h->guardian_pidns == here);
}

bool SnapshotSegment::abandoned() const { return owner_gone() && guardian_gone(); }

void SnapshotSegment::set_owner(int pid, int guardian_pid) {
  WEFT_CHECK(writable_, "snapshot segment ", name_, " is mapped read-only");
  SegmentHeader* h = header(base_);
  h->owner_pid = pid;
  h->owner_pidns = pid_namespace();
  h->guardian_pid = std::max(guardian_pid, 0);
  h->guardian_pidns = h->owner_pidns;
  if (version_ < int(kVersion)) {
    // An older segment taken over (a weft upgraded while its job ran): made current, so that
    // its guardian counts. Its fields past the old ones were zeros, its layout is the same.
    if (version_ == 1) h->slots = slots_;
    std::atomic_thread_fence(std::memory_order_release);
    std::atomic_ref<uint32_t>(h->version).store(kVersion, std::memory_order_release);
    version_ = int(kVersion);
  }
}

void* SnapshotSegment::begin(const SnapshotMeta& meta) {
  WEFT_CHECK(base_ && writable_, "snapshot segment ", name_, " is not mapped for writing");
  WEFT_CHECK(meta.payload_bytes >= 0 && meta.payload_bytes <= capacity(), "snapshot segment ",
             name_, ": payload of ", meta.payload_bytes, " bytes, capacity ", capacity());
  WEFT_CHECK(valid_job_id(meta.job_id), "snapshot segment ", name_, ": job id '", meta.job_id,
             "' is not 16 lowercase hex digits");
  // Never the newest committed slot; of the others an uncommitted one first, else the oldest.
  int newest = -1, slot = -1;
  for (int i = 0; i < slots_; ++i)
    if (sequence(i) > 0 && (newest < 0 || sequence(i) > sequence(newest))) newest = i;
  for (int i = 0; i < slots_; ++i) {
    if (i == newest) continue;
    if (slot < 0 || (sequence(slot) > 0 && sequence(i) < sequence(slot))) slot = i;
  }
  // Uncommit first, and order that before every payload byte (the seqlock writer's fence):
  // a reader that sees any new byte also sees sequence 0 or a later commit.
  sequence_word(base_, slot).store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  SlotHeader* sh = slot_header(base_, slot);
  std::memset(sh->job_id, 0, sizeof sh->job_id);
  std::memcpy(sh->job_id, meta.job_id.data(), meta.job_id.size());
  sh->kind = uint32_t(meta.kind);
  sh->owner_node = meta.owner_node;
  sh->epoch = meta.epoch;
  sh->step = meta.step;
  sh->rank = meta.rank;
  sh->world = meta.world;
  sh->layout_hash = meta.layout_hash;
  sh->payload_bytes = meta.payload_bytes;
  sh->block_count = blocks_for(meta.payload_bytes);
  writing_ = slot;
  return payload(base_, slot);
}

SnapshotMeta SnapshotSegment::commit(const std::vector<uint32_t>& block_crc32c) {
  WEFT_CHECK(base_ && writing_ >= 0, "snapshot segment ", name_, ": commit() without begin()");
  const int slot = writing_;
  SlotHeader* sh = slot_header(base_, slot);
  uint32_t* table = crc_table(base_, slot);
  const char* data = payload(base_, slot);
  const int64_t n = sh->block_count;
  if (!block_crc32c.empty()) {
    WEFT_CHECK(int64_t(block_crc32c.size()) == n, "snapshot segment ", name_, ": ",
               block_crc32c.size(), " block checksums for ", n, " blocks of ", kSnapshotBlockBytes,
               " bytes");
    std::copy(block_crc32c.begin(), block_crc32c.end(), table);
  } else {
    for (int64_t i = 0; i < n; ++i)
      table[i] = crc32c(
          data + i * kSnapshotBlockBytes,
          size_t(std::min(kSnapshotBlockBytes, sh->payload_bytes - i * kSnapshotBlockBytes)));
  }
  // Another slot holds the newest committed sequence (begin() never picks it).
  int64_t next = 1;
  for (int i = 0; i < slots_; ++i)
    if (i != slot) next = std::max(next, sequence(i) + 1);
  sequence_word(base_, slot).store(next, std::memory_order_release);
  writing_ = -1;
  std::optional<View> v = this->slot(slot);
  WEFT_CHECK(v.has_value(), "snapshot segment ", name_, ": slot ", slot, " changed under commit");
  return v->meta;
}

std::optional<SnapshotSegment::View> SnapshotSegment::slot(int slot) const {
  WEFT_CHECK(base_ && slot >= 0 && slot < slots_, "snapshot segment ", name_, ": slot ", slot);
  const SlotHeader* sh = slot_header(base_, slot);
  // A seqlock read: the same nonzero sequence before and after copying the header.
  for (;;) {
    int64_t before = sequence_word(base_, slot).load(std::memory_order_acquire);
    if (before == 0) return std::nullopt;
    SlotHeader copy = *sh;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (sequence_word(base_, slot).load(std::memory_order_relaxed) != before) continue;
    if (copy.payload_bytes < 0 || copy.payload_bytes > capacity() ||
        copy.block_count != blocks_for(copy.payload_bytes))
      throw IoError(str("snapshot segment ", name_, " slot ", slot, " has a corrupt header (",
                        copy.payload_bytes, " payload bytes in ", copy.block_count,
                        " blocks, capacity ", capacity(), ")"));
    View v;
    v.slot = slot;
    v.payload = payload(base_, slot);
    v.meta.job_id.assign(copy.job_id, strnlen(copy.job_id, sizeof copy.job_id));
    v.meta.kind = SegmentKind(copy.kind);
    v.meta.owner_node = copy.owner_node;
    v.meta.epoch = copy.epoch;
    v.meta.step = copy.step;
    v.meta.rank = copy.rank;
    v.meta.world = copy.world;
    v.meta.layout_hash = copy.layout_hash;
    v.meta.payload_bytes = copy.payload_bytes;
    v.meta.sequence = before;
    return v;
  }
}

std::optional<SnapshotSegment::View> SnapshotSegment::latest() const {
  std::optional<View> best;
  for (int i = 0; i < slots_; ++i)
    if (std::optional<View> v = slot(i); v && (!best || v->meta.sequence > best->meta.sequence))
      best = v;
  return best;
}

int64_t SnapshotSegment::sequence(int slot) const {
  WEFT_CHECK(base_ && slot >= 0 && slot < slots_, "snapshot segment ", name_, ": slot ", slot);
  return sequence_word(base_, slot).load(std::memory_order_acquire);
}

std::vector<uint32_t> SnapshotSegment::block_crc32c(const View& v) const {
  const uint32_t* table = crc_table(base_, v.slot);
  return std::vector<uint32_t>(table, table + blocks_for(v.meta.payload_bytes));
}

void SnapshotSegment::populate_writing(int64_t from, int64_t bytes) {
  WEFT_CHECK(base_ && writable_ && writing_ >= 0, "snapshot segment ", name_,
             ": populate_writing() without begin()");
  const int64_t page = header(base_)->page_bytes;
  // Whole pages covering the range (the payload starts on a page).
  const int64_t lo = std::clamp<int64_t>(from, 0, capacity()) / page * page;
  const int64_t hi =
      round_up(std::clamp<int64_t>(from + std::max<int64_t>(bytes, 0), 0, capacity()), page);
  const int64_t n = hi - lo;
  if (n <= 0) return;
  char* p = payload(base_, writing_) + lo;
  // Allocated through the file first, then mapped in: on tmpfs that took 160 + 160 ms for
  // 403 MiB where MADV_POPULATE_WRITE over the holes took 400 ms (load 10), and a fault per
  // page as the writer wrote took 270-430 ms more. Before 5.14 (EINVAL) the writes fault.
  allocate_range(name_, p - static_cast<char*>(base_), n);
  if (const int e = populate_pages(p, size_t(n), PageAccess::kWrite); e != 0 && e != EINVAL)
    throw IoError(str("cannot map in ", n >> 20, " MiB of snapshot segment ", name_, ": ",
                      std::strerror(e)));
}

void SnapshotSegment::allocate_slots() {
  WEFT_CHECK(base_ && writable_, "snapshot segment ", name_,
             ": allocate_slots() needs a writable mapping");
  allocate_range(name_, 0, header(base_)->total_bytes);
}

void SnapshotSegment::populate(const View& v) const {
  // The whole pages the payload touches: the mapping is of whole pages.
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t from = reinterpret_cast<uintptr_t>(v.payload) & ~(page - 1);
  const uintptr_t to =
      (reinterpret_cast<uintptr_t>(v.payload) + uintptr_t(v.meta.payload_bytes) + page - 1) &
      ~(page - 1);
  if (to > from) (void)populate_pages(reinterpret_cast<void*>(from), to - from, PageAccess::kRead);
}

std::vector<int64_t> SnapshotSegment::corrupt_blocks(const View& v) const {
  const uint32_t* table = crc_table(base_, v.slot);
  const char* data = static_cast<const char*>(v.payload);
  std::vector<int64_t> bad;
  for (int64_t i = 0, n = blocks_for(v.meta.payload_bytes); i < n; ++i) {
    int64_t len = std::min(kSnapshotBlockBytes, v.meta.payload_bytes - i * kSnapshotBlockBytes);
    if (crc32c(data + i * kSnapshotBlockBytes, size_t(len)) != table[i]) bad.push_back(i);
  }
  return bad;
}

std::vector<std::string> snapshot_segments(const std::string& job_id) {
  const std::string prefix = kPrefix + (job_id.empty() ? "" : job_id + "-");
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kShmDir, ec)) {
    std::string n = e.path().filename().string();
    if (n.compare(0, prefix.size(), prefix) == 0) names.push_back("/" + n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string segment_name(const std::string& job_id, SegmentKind kind, int owner_node, int64_t epoch,
                         int rank) {
  WEFT_CHECK(valid_job_id(job_id), "job id '", job_id, "' is not 16 lowercase hex digits");
  WEFT_CHECK(owner_node >= 0 && epoch >= 0 && rank >= 0, "segment_name(node ", owner_node,
             ", epoch ", epoch, ", rank ", rank, ")");
  return str("/", kPrefix, job_id, "-", kind_letter(kind), owner_node, "-e", epoch, "-r", rank);
}

std::optional<SegmentName> parse_segment_name(const std::string& name) {
  std::string_view s = name;
  if (!s.empty() && s[0] == '/') s.remove_prefix(1);
  std::string_view prefix = kPrefix;
  if (s.substr(0, prefix.size()) != prefix) return std::nullopt;
  s.remove_prefix(prefix.size());
  SegmentName out;
  out.job_id = std::string(s.substr(0, 16));
  if (!valid_job_id(out.job_id) || s.size() < 18 || s[16] != '-') return std::nullopt;
  switch (s[17]) {
    case 'd':
      out.kind = SegmentKind::kData;
      break;
    case 'r':
      out.kind = SegmentKind::kReplica;
      break;
    case 'p':
      out.kind = SegmentKind::kParity;
      break;
    case 'b':
      out.kind = SegmentKind::kRebuilt;
      break;
    default:
      return std::nullopt;
  }
  s.remove_prefix(18);
  // A decimal number, then `sep` (or the end when sep is empty).
  auto number = [&s](auto& value, std::string_view sep) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end == s.data() || value < 0) return false;
    s.remove_prefix(size_t(end - s.data()));
    if (s.substr(0, sep.size()) != sep) return false;
    s.remove_prefix(sep.size());
    return true;
  };
  if (!number(out.owner_node, "-e") || !number(out.epoch, "-r") || !number(out.rank, "") ||
      !s.empty())
    return std::nullopt;
  return out;
}

}  // namespace weft::checkpoint
