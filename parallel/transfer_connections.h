// Extra connections for the state router (issue 14): across hosts one TCP stream rarely
// reaches line rate (per-flow limits of NICs and WANs, one core's copies and checksums,
// congestion control), so the router cuts large messages into stripes over several
// communicators of the same members (TransitionOptions::connections), each with its own TCP
// connection per pair and its own event loop: Gloo's own means (one context each), no sockets
// of Weft's. elastic.transfer_connections says how many connections in all.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace weft::parallel {

// Whether the members of `comm` listen on more than one address (`address`: this rank's, the
// one its communicator listens on): only then do messages between ranks cross hosts through
// the communicator, and extra connections can carry anything (same-host pairs use shared
// memory). Collective over `comm` (one all_gather); the same answer on every rank.
bool spans_hosts(comm::Communicator& comm, const std::string& address);

// `count` more Gloo communicators over the members of `o` (its rank, size, store, timeout and
// host), keys under "<o.prefix>/conn<i>", so they never meet the communicator's own. Collective
// over those ranks, like the communicator itself; blocks until every one is connected.
std::vector<std::unique_ptr<comm::Communicator>> connect_more(const comm::CommOptions& o,
                                                              int count);

}  // namespace weft::parallel
