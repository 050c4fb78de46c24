// The Gloo backend: CPU collectives over Gloo's TCP transport, rendezvous through Weft's
// store (one Gloo context per communicator, so one per membership epoch).
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace weft::comm {

// Needs opts.rank, opts.size, opts.store (unless size is 1), opts.prefix (the keys live under
// "<prefix>/gloo"), opts.timeout and opts.host. Blocks until every rank has connected.
// The first one with peers sets SIGPIPE to ignored if it still has its default action, so
// that a dead peer fails writes with EPIPE instead of killing the process.
std::unique_ptr<Communicator> make_gloo_communicator(const CommOptions& opts);

}  // namespace weft::comm
