// Shared-memory channels of the state router: segment layout, the collective setup (create,
// exchange names, map, unlink) and the two-slot pipeline with futex doorbells.
#include "parallel/shm_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "base/check.h"
#include "base/error.h"
#include "base/log.h"

namespace weft::parallel {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMagic = 0x314d485354464557;  // "WEFTSHM1"
constexpr int kSpins = 256;                      // polls before sleeping on the doorbell
constexpr auto kNap = std::chrono::milliseconds(5);
constexpr auto kLivenessEvery = std::chrono::milliseconds(50);

// Offset 0 of a segment. Written once by the owner before its name is published; after
// that only the two futex words change.
struct Header {
  uint64_t magic;
  uint64_t size;
  int32_t owner, world, channels, slots;
  alignas(64) uint32_t doorbell;  // rung (incremented + FUTEX_WAKE) by whoever changes a slot
  alignas(64) uint32_t failed;    // 1 once the owner gave up (ShmTransport::abort)
};
constexpr size_t kTableAt = 256;
static_assert(sizeof(Header) <= kTableAt);

// One incoming channel of the owner: `slots` slot controls at `ctrl`, the slots' bytes at
// `data` (slot i at data + i * chunk).
struct ChannelDesc {
  int32_t sender, pad;
  int64_t chunk, ctrl, data;
};

// One cache line per slot. full: 0 = the sender may write, 1 = the receiver may read `bytes`.
struct SlotCtl {
  uint32_t full, pad;
  int64_t bytes;
  char line[48];
};
static_assert(sizeof(SlotCtl) == 64);

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A process-shared futex word (not FUTEX_PRIVATE: the peers are other processes).
void ring(uint32_t* word) {
  std::atomic_ref<uint32_t>(*word).fetch_add(1, std::memory_order_release);
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void nap(uint32_t* word, uint32_t seen) {
  timespec ts{0, long(std::chrono::nanoseconds(kNap).count())};
  ::syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The pid namespace of this process (0 when unknown): a pid means something only inside it.
uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? uint64_t(st.st_ino) : 0;
}

// True when `pid` has exited (gone, or a zombie not yet reaped).
bool exited(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t close = s.rfind(')');
  if (close == std::string::npos || close + 2 >= s.size()) return false;
  return s[close + 2] == 'Z' || s[close + 2] == 'X';
}

// What every rank contributes to the first all_gather.
struct Record {
  char name[96];
  int32_t pid, created;
  uint64_t pidns;
  char pad[16];
};
static_assert(sizeof(Record) == 128);

std::string random_hex() {
  std::random_device rd;
  uint64_t v = (uint64_t(rd()) << 32) ^ rd();
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
  return b;
}

template <typename T>
core::Tensor bytes_of(const T& v) {
  core::Tensor t = core::Tensor::empty({int64_t(sizeof(T))}, core::DType::kU8);
  std::memcpy(t.raw_data(), &v, sizeof(T));
  return t;
}

}  // namespace

struct ShmTransport::Peer {
  char* base = nullptr;
  size_t size = 0;
  Header* hdr = nullptr;
  pid_t pid = 0;
  bool same_pidns = false;
  Clock::time_point next_liveness{};
  // This rank -> the peer: this rank's channel in the peer's segment.
  SlotCtl* out_ctl = nullptr;
  char* out_data = nullptr;
  int64_t out_chunk = 0;
  uint64_t out_seq = 0;
  // The peer -> this rank: the peer's channel in this rank's segment.
  SlotCtl* in_ctl = nullptr;
  char* in_data = nullptr;
  int64_t in_chunk = 0;
  uint64_t in_seq = 0;
  int slots = 0;  // of the peer's segment (its incoming channels)
};

namespace {

const ChannelDesc* find_channel(const char* base, int sender) {
  const auto* h = reinterpret_cast<const Header*>(base);
  const auto* table = reinterpret_cast<const ChannelDesc*>(base + kTableAt);
  for (int c = 0; c < h->channels; ++c)
    if (table[c].sender == sender) return &table[c];
  return nullptr;
}

// Checks a mapped segment's header against its owner and size; the table must fit.
bool valid(const char* base, size_t size, int owner, int world) {
  if (size < kTableAt) return false;
  const auto* h = reinterpret_cast<const Header*>(base);
  if (h->magic != kMagic || h->size != size || h->owner != owner || h->world != world ||
      h->channels < 0 || h->channels > world || h->slots < 2)
    return false;
  if (kTableAt + size_t(h->channels) * sizeof(ChannelDesc) > size) return false;
  const auto* table = reinterpret_cast<const ChannelDesc*>(base + kTableAt);
  for (int c = 0; c < h->channels; ++c) {
    const ChannelDesc& d = table[c];
    if (d.chunk <= 0 || d.ctrl < 0 || d.data < 0 ||
        size_t(d.ctrl) + size_t(h->slots) * sizeof(SlotCtl) > size ||
        size_t(d.data) + size_t(h->slots) * size_t(d.chunk) > size)
      return false;
  }
  return true;
}

}  // namespace

ShmTransport::ShmTransport(comm::Communicator& comm, const std::vector<int64_t>& largest,
                           const ShmOptions& opt)
    : comm_(comm), rank_(comm.rank()), world_(comm.size()), largest_(largest) {
  const int w = world_, me = rank_;
  WEFT_CHECK(largest_.size() == size_t(w) * size_t(w), "router shm: ", largest_.size(),
             " pair sizes for a world of ", w);
  WEFT_CHECK(opt.slots >= 2 && opt.chunk_bytes > 0, "router shm: need 2+ slots of 1+ bytes");
  auto pair = [&](int s, int d) { return largest_[size_t(s) * size_t(w) + size_t(d)]; };
  peers_.resize(size_t(w));
  usable_.assign(size_t(w) * size_t(w), 0);

  // 1. This rank's segment: a channel per same-host sender, slots sized to its largest message.
  std::vector<int> senders;
  bool involved = false;
  for (int q = 0; q < w; ++q) {
    if (q != me && pair(q, me) > 0) senders.push_back(q);
    involved = involved || (q != me && (pair(q, me) > 0 || pair(me, q) > 0));
  }
  Record mine{};
  mine.pid = int32_t(::getpid());
  mine.pidns = pid_namespace();
  if (involved) {
    const std::string name = "/weft-router-" + std::to_string(::getpid()) + "-" +
                             std::to_string(me) + "-" + random_hex();
    size_t ctrl = kTableAt + round_up(senders.size() * sizeof(ChannelDesc), 64);
    size_t data = round_up(ctrl + senders.size() * size_t(opt.slots) * sizeof(SlotCtl), 4096);
    std::vector<ChannelDesc> table;
    for (size_t c = 0; c < senders.size(); ++c) {
      int64_t chunk =
          int64_t(round_up(size_t(std::min(opt.chunk_bytes, pair(senders[c], me))), 64));
      table.push_back({senders[c], 0, chunk,
                       int64_t(ctrl + c * size_t(opt.slots) * sizeof(SlotCtl)), int64_t(data)});
      data += round_up(size_t(opt.slots) * size_t(chunk), 4096);
    }
    const size_t size = data;
    int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    std::string why;
    if (fd < 0) {
      why = str("shm_open: ", std::strerror(errno));
    } else {
      int rc = ::ftruncate(fd, off_t(size)) == 0 ? ::posix_fallocate(fd, 0, off_t(size)) : errno;
      void* p =
          rc == 0 ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
      if (rc != 0) why = str("reserving ", size, " bytes: ", std::strerror(rc));
      if (rc == 0 && p == MAP_FAILED) why = str("mmap: ", std::strerror(errno));
      ::close(fd);
      if (p != MAP_FAILED) {
        Peer& own = peers_[size_t(me)];
        own.base = static_cast<char*>(p), own.size = size;
        own.hdr = reinterpret_cast<Header*>(own.base);
        own.hdr->size = size, own.hdr->owner = me, own.hdr->world = w;
        own.hdr->channels = int32_t(senders.size()), own.hdr->slots = opt.slots;
        std::memcpy(own.base + kTableAt, table.data(), table.size() * sizeof(ChannelDesc));
        own.hdr->magic = kMagic;  // published by the all_gather below
        own_name_ = name;
        mine.created = 1;
        std::snprintf(mine.name, sizeof mine.name, "%s", name.c_str());
      } else {
        ::shm_unlink(name.c_str());
      }
    }
    if (!why.empty())
      WEFT_WARN("router", "rank ", me, ": no shared-memory segment (", why,
                "); its same-host messages use the communicator");
  }

  std::vector<Record> recs(static_cast<size_t>(w));
  std::vector<char> ok(size_t(w) * size_t(w), 0);
  try {
    // 2. Names, pids; then each rank maps the segments of the peers it talks to.
    core::Tensor all =
        core::Tensor::empty({int64_t(w) * int64_t(sizeof(Record))}, core::DType::kU8);
    comm_.all_gather(all, bytes_of(mine)).wait();
    std::memcpy(recs.data(), all.raw_data(), recs.size() * sizeof(Record));
    const uint64_t ns = mine.pidns;
    core::Tensor row = core::Tensor::zeros({int64_t(w)}, core::DType::kU8);
    for (int q = 0; q < w; ++q) {
      Peer& p = peers_[size_t(q)];
      p.pid = recs[size_t(q)].pid;
      p.same_pidns = ns != 0 && recs[size_t(q)].pidns == ns;
      if (q == me || !(pair(q, me) > 0 || pair(me, q) > 0) || !recs[size_t(q)].created) continue;
      if (!peers_[size_t(me)].base) continue;
      recs[size_t(q)].name[sizeof(Record::name) - 1] = 0;
      int fd = ::shm_open(recs[size_t(q)].name, O_RDWR, 0);
      struct stat st {};
      if (fd < 0 || ::fstat(fd, &st) != 0) {
        if (fd >= 0) ::close(fd);
        WEFT_WARN("router", "rank ", me, ": cannot open rank ", q, "'s segment ",
                  recs[size_t(q)].name, ": ", std::strerror(errno), " (not the same host?)");
        continue;
      }
      void* m = ::mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (m == MAP_FAILED) continue;
      p.base = static_cast<char*>(m), p.size = size_t(st.st_size);
      p.hdr = reinterpret_cast<Header*>(p.base);
      const ChannelDesc* out = pair(me, q) > 0 ? find_channel(p.base, me) : nullptr;
      if (!valid(p.base, p.size, q, w) || (pair(me, q) > 0 && !out)) {
        ::munmap(p.base, p.size);
        p.base = nullptr, p.hdr = nullptr, p.size = 0;
        continue;
      }
      p.slots = p.hdr->slots;
      if (out) {
        p.out_ctl = reinterpret_cast<SlotCtl*>(p.base + out->ctrl);
        p.out_data = p.base + out->data, p.out_chunk = out->chunk;
      }
      if (const ChannelDesc* in =
              pair(q, me) > 0 ? find_channel(peers_[size_t(me)].base, q) : nullptr) {
        p.in_ctl = reinterpret_cast<SlotCtl*>(peers_[size_t(me)].base + in->ctrl);
        p.in_data = peers_[size_t(me)].base + in->data, p.in_chunk = in->chunk;
      }
      row.data<uint8_t>()[q] = 1;
    }
    // 3. Who mapped whom; then nobody opens a name again, so unlink it.
    core::Tensor oks = core::Tensor::empty({int64_t(w) * int64_t(w)}, core::DType::kU8);
    comm_.all_gather(oks, row).wait();
    std::memcpy(ok.data(), oks.raw_data(), ok.size());
  } catch (...) {
    // A failed exchange fails every rank; the names gathered so far are unlinked here too.
    for (const Record& r : recs)
      if (r.created) ::shm_unlink(std::string(r.name, strnlen(r.name, sizeof r.name)).c_str());
    if (!own_name_.empty()) ::shm_unlink(own_name_.c_str());
    for (Peer& p : peers_)
      if (p.base) ::munmap(p.base, p.size);
    throw;
  }
  if (!own_name_.empty()) ::shm_unlink(own_name_.c_str());
  own_name_.clear();
  for (int s = 0; s < w; ++s)
    for (int d = 0; d < w; ++d)
      usable_[size_t(s) * size_t(w) + size_t(d)] = s != d && pair(s, d) > 0 &&
                                                   ok[size_t(s) * size_t(w) + size_t(d)] &&
                                                   ok[size_t(d) * size_t(w) + size_t(s)];
}

ShmTransport::~ShmTransport() {
  for (Peer& p : peers_)
    if (p.base) ::munmap(p.base, p.size);
  if (!own_name_.empty()) ::shm_unlink(own_name_.c_str());
}

bool ShmTransport::usable(int src, int dst) const {
  if (src < 0 || dst < 0 || src >= world_ || dst >= world_) return false;
  return usable_[size_t(src) * size_t(world_) + size_t(dst)];
}

int64_t ShmTransport::bytes_reserved() const {
  return rank_ >= 0 && size_t(rank_) < peers_.size() ? int64_t(peers_[size_t(rank_)].size) : 0;
}

void ShmTransport::abort() noexcept {
  if (aborted_) return;
  aborted_ = true;
  Peer& own = peers_[size_t(rank_)];
  if (!own.hdr) return;
  std::atomic_ref<uint32_t>(own.hdr->failed).store(1, std::memory_order_release);
  for (Peer& p : peers_)
    if (p.hdr) ring(&p.hdr->doorbell);
}

void ShmTransport::check_peer(int peer, const char* waiting_for, Clock::time_point since) {
  Peer& p = peers_[size_t(peer)];
  if (std::atomic_ref<uint32_t>(p.hdr->failed).load(std::memory_order_acquire))
    throw CommError(
        str("router shm: rank ", peer, " failed while rank ", rank_, " waited for ", waiting_for));
  if (comm_.aborted())
    throw CommError(str("router shm: the communicator of rank ", rank_, " was aborted"));
  const auto now = Clock::now();
  if (p.same_pidns && now >= p.next_liveness) {
    p.next_liveness = now + kLivenessEvery;
    if (exited(p.pid))
      throw PeerLostError(peer, str("router shm: rank ", peer, " (pid ", p.pid,
                                    ") died while rank ", rank_, " waited for ", waiting_for));
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - since);
  if (waited > comm_.timeout())
    throw TimeoutError(str("router shm: rank ", rank_, " waited ", waited.count(), " ms for ",
                           waiting_for, " of rank ", peer, " (timeout ", comm_.timeout().count(),
                           " ms)"));
}

void ShmTransport::exchange(const Send* send, const Recv* recv,
                            const std::function<void(int64_t, int64_t)>& on_chunk) {
  if (aborted_) throw CommError(str("router shm: rank ", rank_, "'s transport failed earlier"));
  const int64_t to_send = send ? send->bytes : 0, to_recv = recv ? recv->bytes : 0;
  if (to_send == 0 && to_recv == 0) return;
  WEFT_CHECK(to_send == 0 || usable(rank_, send->peer), "router shm: no channel ", rank_, " -> ",
             send->peer);
  WEFT_CHECK(to_recv == 0 || usable(recv->peer, rank_), "router shm: no channel ", recv->peer,
             " -> ", rank_);
  Peer* out = to_send ? &peers_[size_t(send->peer)] : nullptr;
  Peer* in = to_recv ? &peers_[size_t(recv->peer)] : nullptr;
  uint32_t* bell = &peers_[size_t(rank_)].hdr->doorbell;
  const int own_slots = peers_[size_t(rank_)].hdr->slots;
  int64_t sent = 0, got = 0;
  auto last = Clock::now();
  int idle = 0;
  // The outgoing slots still full: the receiver has not unpacked them yet.
  auto undrained = [&] {
    if (!out) return false;
    for (int k = 0; k < out->slots; ++k)
      if (std::atomic_ref<uint32_t>(out->out_ctl[size_t(k)].full).load(
              std::memory_order_acquire) != 0)
        return true;
    return false;
  };
  while (sent < to_send || got < to_recv || undrained()) {
    const uint32_t seen = std::atomic_ref<uint32_t>(*bell).load(std::memory_order_acquire);
    bool moved = false;
    if (sent < to_send) {
      const size_t slot = size_t(out->out_seq % uint64_t(out->slots));
      SlotCtl& c = out->out_ctl[slot];
      if (std::atomic_ref<uint32_t>(c.full).load(std::memory_order_acquire) == 0) {
        const int64_t n = std::min(out->out_chunk, to_send - sent);
        send->pack(sent, out->out_data + int64_t(slot) * out->out_chunk, n);
        c.bytes = n;
        std::atomic_ref<uint32_t>(c.full).store(1, std::memory_order_release);
        ring(&out->hdr->doorbell);
        ++out->out_seq, sent += n, moved = true;
        if (on_chunk) on_chunk(n, 0);
      }
    }
    if (got < to_recv) {
      const size_t slot = size_t(in->in_seq % uint64_t(own_slots));
      SlotCtl& c = in->in_ctl[slot];
      if (std::atomic_ref<uint32_t>(c.full).load(std::memory_order_acquire) == 1) {
        const int64_t n = c.bytes;
        if (n <= 0 || n > to_recv - got)
          throw InternalError(str("router shm: rank ", recv->peer, " sent a chunk of ", n,
                                  " bytes, rank ", rank_, " expects ", to_recv - got, " more"));
        recv->unpack(got, in->in_data + int64_t(slot) * in->in_chunk, n);
        std::atomic_ref<uint32_t>(c.full).store(0, std::memory_order_release);
        ring(&in->hdr->doorbell);
        ++in->in_seq, got += n, moved = true;
        if (on_chunk) on_chunk(0, n);
      }
    }
    if (moved) {
      last = Clock::now(), idle = 0;
      continue;
    }
    if (++idle < kSpins) {
      cpu_relax();
      continue;
    }
    if (out) check_peer(send->peer, sent < to_send ? "a free slot" : "its last chunks read", last);
    if (got < to_recv) check_peer(recv->peer, "data", last);
    nap(bell, seen);
  }
}

}  // namespace weft::parallel
