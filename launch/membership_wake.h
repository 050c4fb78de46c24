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
// The wait runs on a store connection of its own: a wait parked on the agent's connection
// would hold a reply in the kernel's send queue while the node is cut off, and after the
// cable comes back the agent's own calls (its heartbeat, its monitor's reads) would queue
// behind that reply's retransmission backoff, seconds past heartbeat_timeout.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "comm/elastic/rendezvous.h"
#include "comm/store/store.h"

namespace weft::launch {

class MembershipWake {
 public:
  // Starts the thread; `park`: the longest single store wait, which bounds how long the
  // destructor waits for the thread. `store` (a connection for this alone) and `rdzv`
  // (after join(); only its keys are used) must outlive this object. Throws IoError when
  // no eventfd can be made.
  MembershipWake(comm::Store& store, const comm::Rendezvous& rdzv, comm::Millis park);
  ~MembershipWake();  // stops and joins the thread (at most one `park`); never throws
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
  void loop();
  void watch_losses();
  void wake();
  comm::Store& store_;
  const comm::Rendezvous& rdzv_;
  const comm::Millis park_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> wakes_{0};
  std::atomic<uint64_t> loss_wakes_{0};
  std::thread thread_;
  std::thread losses_;
};

}  // namespace weft::launch
