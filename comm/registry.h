// Building communicators: an explicit table of the backends this build has (each under its
// #if WEFT_HAVE_X, after ggml's ggml-backend-reg.cpp), never self-registering statics.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace weft::comm {

// Builds a communicator of `kind` for the world described by `opts` (see CommOptions).
// Collective: every rank of the world calls it with the same kind, size and prefix; it
// blocks until the world is connected (Gloo, NCCL: through the store; MPI: MPI_Comm_idup of
// the MPI world), bounded by opts.timeout.
// Throws NotSupported when this build lacks the backend (the message names the CMake option
// and the package), InternalError for inconsistent options (rank outside size, missing store),
// TimeoutError when peers do not show up in time, CommError for other failures.
std::unique_ptr<Communicator> make_communicator(BackendKind kind, const CommOptions& opts);

// Whether this build has `kind` (MPI and NCCL may still fail at run time: no mpirun, no GPU).
bool backend_available(BackendKind kind);
// The backends of this build, loopback first.
std::vector<BackendKind> available_backends();
// "loopback", "gloo", "mpi", "nccl" -> kind; anything else throws ConfigError naming `field`.
BackendKind parse_backend(const std::string& name, const std::string& field);

}  // namespace weft::comm
