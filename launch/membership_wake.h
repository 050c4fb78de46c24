// Wakes a node agent's supervisor loop as soon as the membership record changes, so that it
// looks at the membership then rather than at its next --monitor-interval poll: a thread
// parked in a store wait on the record's next change key (Rendezvous::change_key, set by
// every write) signals an eventfd that the supervisor polls beside its workers' pipes
// (SupervisorOptions::wake_fd). Every record write wakes it: a node that left (its agent
// writes `left` within milliseconds of its worker's death), an epoch another survivor
// formed, a spare registering, a close. A change nobody writes, a member or spare whose alive
// key went (its agent's process died and the store dropped its bound key), wakes it too where
// the store can wait for a key to go (Store::waits_for_absence: TCPStore, and etcd through a
// watch's DELETE events): a second thread parks in wait_gone() on the alive keys of the
// record's members, spares and departing nodes. Over etcd that wakes every survivor when a
// lease runs out (a host that vanished, a frozen agent) and when the peer check erases a
// dead node's key; the peer check also pokes its own agent (poke_loss). The monitor's poll
// stays as the fallback (a store whose wait_gone() throws).
//
// Each wait parks until its change, a stop or kPark (a minute: a safety net, not a poll), so
// over etcd an idle agent holds two watches for as long as nothing changes instead of making
// new ones several times a second: the destructor ends both waits at once
// (Store::wait_stoppable), and a record change ends the loss thread's wait, which then reads
// the record's new members and spares and parks on their keys.
//
// The wait runs on a store connection of its own: a wait parked on the agent's connection
// would hold a reply in the kernel's send queue while the node is cut off, and after the
// cable comes back the agent's own calls (its heartbeat, its monitor's reads) would queue
// behind that reply's retransmission backoff, seconds past heartbeat_timeout.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>

#include "comm/elastic/rendezvous.h"
#include "comm/store/store.h"

namespace weft::launch {

class MembershipWake {
 public:
  // The longest single store wait: a wait that nothing ended by then reads the record again
  // and parks anew (a change whose change key was never set, its writer gone between the
  // record and the key, is seen then; the monitor's poll sees it sooner).
  static constexpr comm::Millis kPark{60'000};

  // Starts the threads; `retry`: the pause after a store call that failed (the store is
  // unreachable or slow: the monitor's own poll notices and says so) before trying again.
  // `store` (a connection for this alone) and `rdzv` (after join(); only its keys are used)
  // must outlive this object. Throws IoError when no eventfd can be made.
  MembershipWake(comm::Store& store, const comm::Rendezvous& rdzv, comm::Millis retry);
  // Stops both waits and joins the threads: at once, unless a store call other than the
  // parked waits (a read of the record) is in flight. Never throws.
  ~MembershipWake();
  MembershipWake(const MembershipWake&) = delete;
  MembershipWake& operator=(const MembershipWake&) = delete;

  // Wakes the supervisor now for a loss seen elsewhere: the peer check (comm/elastic/
  // peer_check.h) erased a node's alive key, which a store that cannot wait for a key to go
  // (etcd) would leave to the next poll. Thread-safe; never throws.
  void poke_loss() {
    loss_wakes_.fetch_add(1);
    wake();
  }
  // Readable after a change; the reader drains it (read 8 bytes, non-blocking).
  int fd() const { return fd_; }
  // Wakes sent so far, and how many of them were for an alive key that went.
  uint64_t wakes() const { return wakes_.load(); }
  uint64_t loss_wakes() const { return loss_wakes_.load(); }
  // Whether the second thread watches alive keys (the store can wait for a key to go).
  bool watches_losses() const { return losses_.joinable(); }

 private:
  void loop(std::stop_token stop);
  void watch_losses(std::stop_token stop);
  void wake();
  // The loss thread's wait on the keys of the record it read (a round): a new one; the
  // version it read; and the end of the current one when the record reached `version` since
  // (its keys are not the ones to wait on any more). A round whose read has not come back yet
  // ends too: that read may be older. Only a wait that is parked on older keys ends, so that a
  // TCPStore server is left no stopped wait when nothing changed.
  std::stop_source next_round();
  void round_read(int64_t version);
  void end_round(int64_t version);

  comm::Store& store_;
  const comm::Rendezvous& rdzv_;
  const comm::Millis retry_;
  int fd_ = -1;
  std::atomic<uint64_t> wakes_{0};
  std::atomic<uint64_t> loss_wakes_{0};
  std::mutex round_mu_;
  std::stop_source round_;   // the loss thread's current round (guarded by round_mu_)
  int64_t round_read_ = -1;  // the version that round read; -1 before (guarded likewise)
  // Last: stopped and joined by the destructor before the rest goes.
  std::jthread thread_;
  std::jthread losses_;
};

}  // namespace weft::launch
