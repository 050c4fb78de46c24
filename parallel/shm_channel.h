// Same-host transport of the state router: a message between two ranks of one machine moves
// through a POSIX shared-memory ring instead of the communicator. Gloo over 127.0.0.1 copies
// every byte into a staging tensor, through the kernel's socket buffers twice and out again;
// here the sender packs straight into a shared chunk and the receiver unpacks straight out of
// it, two copies that overlap (one slot is filled while the other is drained). Its slots
// (4 x 512 KiB) stay in the last-level cache, so each byte crosses memory once, on two cores.
// A single copy (cross-memory attach: the receiver reads the sender's sources straight into
// its destinations with process_vm_readv, as Open MPI's vader does) was built, tested and
// measured on 2026-12-05 and not kept, because it was slower here: 600 MiB between two
// processes into touched memory, process_vm_readv 8.2 GB/s (0.43x memcpy's 18-19 GB/s; two
// threads no faster), the ring 18.8-20.6 GB/s; with two pairs at once 4.5-5.8 against
// 4.3-9.5 GB/s a receiver; in the benches' moves slower every time (ZeRO-3 survivors'
// 583-875 MiB 0.14-0.22 s against 0.09-0.15 s; node loss 604 MiB 0.17 / 0.40 s against
// 0.13 / 0.21 s, replica / ec). It also needs ptrace rights over the peer, which Yama and
// container seccomp profiles may deny. Where the benches fall short of memcpy it is the
// destinations' page faults and the cores every rank shares, not the ring's second copy.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace weft::parallel {

struct ShmOptions {
  // Bytes per slot; a channel whose largest message is smaller gets slots of that size.
  int64_t chunk_bytes = int64_t(512) << 10;
  int slots = 4;  // per channel, at least 2 so that both ends copy at once
};

// One rank's end of the shared-memory channels of one transition. Each rank that takes part
// creates one segment: a header (its doorbell, a futex word every peer rings after changing a
// slot this rank waits on, and a failed flag) and one channel per same-host rank that sends to
// it, each `slots` slots of one chunk; the slots' bytes are reserved with posix_fallocate, so
// a full /dev/shm fails the setup (that pair then uses the communicator) instead of raising
// SIGBUS mid-transfer. Segments are unlinked as soon as every peer has mapped them: a process
// killed afterwards leaves nothing in /dev/shm.
//
// Threads: one thread per transport (the rank's router thread); different transports are
// independent (the bench runs four ranks as threads of one process).
class ShmTransport {
 public:
  // Collective over `comm` (two all_gathers, bounded by its timeout): every rank passes the
  // same `largest`, world x world, largest[s * world + d] = the largest message rank s sends
  // rank d through shared memory (0: none). Never throws for a segment that cannot be created
  // or mapped (logged; usable() is then false for its pairs); throws CommError when the
  // exchange fails.
  ShmTransport(comm::Communicator& comm, const std::vector<int64_t>& largest,
               const ShmOptions& opt = {});
  ~ShmTransport();
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  // True when both ends of s -> d mapped each other's segments: the same answer on every rank.
  bool usable(int src, int dst) const;

  // The bytes of this rank's own segment (its header and its incoming channels, reserved in
  // /dev/shm for the transport's life); 0 when it has none.
  int64_t bytes_reserved() const;

  // pack(offset, out, n) writes bytes [offset, offset + n) of the outgoing message to `out`;
  // unpack(offset, in, n) consumes bytes [offset, offset + n) of the incoming one.
  struct Send {
    int peer = -1;
    int64_t bytes = 0;
    std::function<void(int64_t offset, char* out, int64_t n)> pack;
  };
  struct Recv {
    int peer = -1;
    int64_t bytes = 0;
    std::function<void(int64_t offset, const char* in, int64_t n)> unpack;
  };

  // Moves one message out and one in (either may be null or empty) concurrently, chunk by
  // chunk, and returns when both are done: every outgoing chunk was unpacked by the receiver
  // (its slots drained, so that a sender that frees its source after this loses nothing if
  // the receiver fails later) and every incoming byte was unpacked.
  // on_chunk(sent, received) runs after each chunk. Waits spin briefly, then sleep on the
  // doorbell; throws PeerLostError when the peer waited on died, CommError when it failed
  // (abort()) or the communicator was aborted, TimeoutError when nothing moved for
  // comm.timeout(). After a throw the transport is unusable: call abort().
  //
  // Deadlock freedom: a rank only waits on the peers of its current round, the channel of
  // each ordered pair is its own FIFO, and both directions progress in one loop, so a send
  // never waits on a receiver that is itself blocked sending. Take the earliest round any
  // rank is stuck in: its peers in that round have finished the earlier rounds (else they
  // would be stuck earlier) and cannot have finished this one (the message is not through),
  // so they are in it, draining and filling the same channels: the round completes.
  void exchange(const Send* send, const Recv* recv,
                const std::function<void(int64_t sent, int64_t received)>& on_chunk = {});

  // Marks this rank failed and wakes its peers, so that those waiting on it throw at once
  // instead of at their timeout. Idempotent; never throws.
  void abort() noexcept;

  struct Peer;  // one mapped segment (shm_channel.cc)

 private:
  void check_peer(int peer, const char* waiting_for, std::chrono::steady_clock::time_point since);

  comm::Communicator& comm_;
  int rank_ = -1, world_ = 0;
  std::vector<int64_t> largest_;
  std::vector<char> usable_;  // world x world
  std::vector<Peer> peers_;   // by rank; index rank_ is this rank's own segment
  std::string own_name_;
  bool aborted_ = false;
};

}  // namespace weft::parallel
