// The peer check: agents watch each other through idle TCP connections (peer_link.h), for
// stores that cannot bind a key to a client's connection (etcd, whose leases end by TTL
// only). When a watched agent's process dies, its kernel closes its sockets and the observer
// sees the connection close: it then reports the node lost through the store exactly as a
// TTL expiry would, by erasing the node's alive key (after noting why under
// rdzv/<id>/lost/<node>, which Rendezvous::lost_cause reads), so every survivor's existing
// poll sees the loss and one mechanism decides what follows. The TTL stays the fallback for a
// host that vanishes without closing anything (power loss, a pulled cable, SIGSTOP: a
// stopped process's kernel keeps its connections open).
//
// Every agent watches every other node of the record (members, spares, departing nodes), not
// only a ring successor: N-1 idle sockets per agent is cheap at the node counts of a job, and
// no observer's death can hide another loss (with a ring, two neighbours killed together
// leave the second to the TTL until the ring is rewired). Each survivor that sees the close
// erases the same key; erasing is idempotent.
//
// A connection that closed while its process lives (a transient network reset) must not cost
// the node its place: the observer redials the address the node published, and a link back
// within `grace` (bound_key_grace, as for the TCP store's bound keys) keeps it. When the
// observer can see the process (same machine and pid namespace: the handshake says which
// process listens, and a pidfd pins it), the pidfd decides instead: an exited process never
// reconnects, so it is reported at once; a live one gets the grace.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "comm/elastic/rendezvous.h"
#include "comm/store/store.h"

namespace weft::comm {

struct PeerCheckOptions {
  std::string token;  // the job token (empty: --rdzv-conf insecure=1, no proofs)
  // How long a closed connection of a live process has to come back (redialled every
  // `redial`) before the node is reported lost. 0: at once.
  Millis grace{250};
  Millis redial{20};
  // How often the observer re-reads the record for the nodes to watch, and retries nodes
  // it could not reach (their address not yet published, a refused handshake).
  Millis refresh{500};
  // One dial (connect and handshake) gives up after this long. Each dial runs on a thread
  // of its own (cancelled when the check stops), so a node that does not answer, a
  // blackholed address or a listener that never accepts, delays no other node's check.
  Millis dial_timeout{1'000};
  // Called on the check's thread after it reported `node` lost (its alive key erased), with
  // the cause: the agent looks at the membership at once instead of at its next poll.
  std::function<void(const std::string& node, const std::string& cause)> on_lost;
};

class PeerCheck {
 public:
  // Starts the observer's thread. `store` (a connection of its own: the thread blocks on it)
  // and `rdzv` (only its keys and node id are used) must outlive this object. Never throws
  // beyond std::thread's.
  PeerCheck(Store& store, const Rendezvous& rdzv, PeerCheckOptions options);
  ~PeerCheck();  // stops and joins the thread, closes the links; never throws
  PeerCheck(const PeerCheck&) = delete;
  PeerCheck& operator=(const PeerCheck&) = delete;

  // Nodes with an open link now, and nodes reported lost so far (for tests and logs).
  int watching() const { return watching_.load(); }
  uint64_t reported() const { return reported_.load(); }
  uint64_t reconnects() const { return reconnects_.load(); }

 private:
  void loop();
  Store& store_;
  const Rendezvous& rdzv_;
  const PeerCheckOptions options_;
  int stop_fd_ = -1;
  std::atomic<int> watching_{0};
  std::atomic<uint64_t> reported_{0}, reconnects_{0};
  std::thread thread_;
};

}  // namespace weft::comm
