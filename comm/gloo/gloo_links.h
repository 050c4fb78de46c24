// GlooLinks: which TCP connection of this process carries each peer of a Gloo context, found
// through public interfaces only (the pair's address, the store, getsockname). It serves to
// name the peer in PeerLostError and to tear the connections down without Gloo's internals.
#pragma once

#include <gloo/context.h>
#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace weft::comm {

class GlooLinks {
 public:
  // Collective over the context's ranks: each publishes the local end of its connections
  // under "<prefix>/links/<rank>" and reads the others'. Call right after connectFullMesh.
  // Connections it cannot identify are left unmapped (fallbacks below), never an error.
  GlooLinks(gloo::Context& context, Store& store, const std::string& prefix);

  // The rank whose connection a Gloo error message names, or -1.
  int peer_in_message(const std::string& message) const;

  // The one rank whose connection is gone (closed, or hung up or reset by the peer), or -1
  // when none or several are. Gloo's message is not enough: under load it can name an
  // address that is neither end of any connection this process has (seen in CI).
  int lost_peer() const;

  // Shuts every connection down (both directions). Gloo's event loop then sees end-of-file
  // on each and fails every transfer waiting on it at once, and the peers see the same.
  // Connections without a known socket are closed through Gloo instead, which releases the
  // peers but leaves local waiters to their timeouts. Thread-safe; never throws.
  void shut_down() noexcept;

 private:
  gloo::Context& context_;
  int rank_;
  std::vector<sockaddr_storage> local_;    // by peer rank: this end of the connection
  std::vector<sockaddr_storage> remote_;   // by peer rank: the peer's end
  std::vector<std::string> remote_names_;  // remote_, as Gloo prints addresses in errors
  std::vector<int> fds_;                   // by peer rank; -1 when not found
};

}  // namespace weft::comm
