// The NCCL backend: collectives on CUDA memory, one stream and one non-blocking NCCL
// communicator per Communicator, the unique id carried by Weft's store.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace weft::comm {

// Needs opts.rank, opts.size, opts.store (unless size is 1: the id then never leaves the
// process), opts.prefix (the id lives at "<prefix>/nccl/unique_id"), opts.timeout and
// opts.device (-1: rank % visible GPUs). Throws CommError when no GPU is visible.
//
// Buffers are device (or managed) memory on the communicator's GPU. Operations run on the
// communicator's own stream, after everything issued before the call to the device's legacy
// default stream; Work::wait() returns once the GPU has finished them. A timeout or abort()
// calls ncclCommAbort, which also releases the peers. Sending to oneself is NotSupported.
std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& opts);

}  // namespace weft::comm
