// The MPI backend (Open MPI): collectives as MPI-3 non-blocking calls polled against their
// timeout, sub-groups through MPI_Comm_split. Ranks come from the MPI world.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace weft::comm {

// Initialises MPI on first use (MPI_Init_thread asking for MPI_THREAD_MULTIPLE, once per
// process; MPI_Finalize at exit) unless the program already did. The communicator is a
// duplicate of MPI_COMM_WORLD; opts.rank and opts.size must be -1 or equal MPI's; the store
// and prefix are not used. Collective over the MPI world.
//
// Failure semantics within MPI's limits: Open MPI without ULFM cannot survive a dead
// process (mpirun ends the job), so PeerLostError is never raised here; a peer that stops
// participating makes the others' operations fail with TimeoutError at their timeout.
// A started MPI collective cannot be cancelled: after a timeout or abort() its request and
// buffers are abandoned (kept alive, never freed) and the communicator is failed.
std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& opts);

}  // namespace weft::comm
