// Communicator: the users' API for collectives and point-to-point transfers between the
// ranks of one world. Backends (loopback, Gloo, MPI, NCCL) implement it; make_communicator()
// in comm/registry.h builds one. Never a global: during a resize the old and the new world
// each have their own communicator, alive side by side.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/work.h"
#include "core/tensor.h"

namespace weft::comm {

class Store;

enum class BackendKind : uint8_t { kLoopback, kGloo, kMpi, kNccl };

// kAvg is the sum divided by size(): exact division for f32/f64, through f32 for bf16,
// truncation toward zero for integers. Integer sums wrap (two's complement, u8 modulo 256).
enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };
const char* reduce_op_name(ReduceOp op);

// Every collective takes one options struct. An unset timeout means the communicator's
// (CommOptions::timeout); it bounds the operation from the moment it starts on the wire.
struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  std::optional<Millis> timeout;
};

// counts[r] = elements of the reduced input that rank r receives, in rank order. Empty means
// balanced: input.numel() / size() each, the first input.numel() % size() ranks one more.
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  std::vector<int64_t> counts;
  std::optional<Millis> timeout;
};

// counts[r] = elements rank r contributes, in rank order. Empty means equal contributions of
// input.numel() each (every rank must then pass the same numel).
struct AllGatherOptions {
  std::vector<int64_t> counts;
  std::optional<Millis> timeout;
};

struct BroadcastOptions {
  int root = 0;
  std::optional<Millis> timeout;
};

struct AllToAllOptions {
  std::optional<Millis> timeout;
};

// Point-to-point messages match by (source, destination, tag) in issue order. Tags are in
// [0, kMaxTag] so that every backend can carry them (MPI guarantees 32767).
inline constexpr int kMaxTag = 32767;
struct SendOptions {
  int tag = 0;
  std::optional<Millis> timeout;
};
struct RecvOptions {
  int tag = 0;
  std::optional<Millis> timeout;
};

struct BarrierOptions {
  std::optional<Millis> timeout;
};

// color < 0 (kNoColor): this rank joins no sub-group and split() returns nullptr.
inline constexpr int kNoColor = -1;
struct SplitOptions {
  std::optional<Millis> timeout;  // for the exchange of colours and the new group's setup
};

// What make_communicator() needs. Which fields a backend reads:
//   rank, size  all backends. Loopback: -1 or 0 and -1 or 1. MPI: -1 takes MPI's world rank
//               and size; other values must equal them.
//   store       Gloo (rendezvous) and NCCL (unique id); may be null for a world of one.
//               Must outlive the communicator and its sub-groups.
//   prefix      namespace of this communicator's keys in the store: one per membership
//               epoch ("epoch/7"), so the communicators of two epochs never share a key.
//   timeout     default for every operation, for the rendezvous and for split().
//   host        Gloo: the address this rank listens on (127.0.0.1 for one machine).
//   device      NCCL: the GPU ordinal; -1 picks rank % device count.
struct CommOptions {
  int rank = -1;
  int size = -1;
  Store* store = nullptr;
  std::string prefix;
  Millis timeout{30'000};
  std::string host = "127.0.0.1";
  int device = -1;
};

// Contract (every backend):
//
// Ordering. Collectives, barrier() and split() are collective over the communicator: every
// rank issues the same sequence of them with matching arguments (dtype, counts, root, op).
// A rank that issues them in another order, or skips one, makes the others fail with
// TimeoutError (or hang a backend without timeouts: none of Weft's). Point-to-point calls
// are not collective; a send matches the recv on the peer with the same tag, in issue order,
// and both must move the same number of bytes. Issue sends and receives so that no cycle of
// waits forms if each call blocked until matched: NCCL runs them in issue order on one stream.
//
// Threads. Any thread may call any method; calls are serialised internally, so two threads
// issuing collectives on one communicator must agree on an order themselves (use one thread
// per communicator, or one communicator per thread). Different communicators are independent:
// two sub-groups, or an old and a new epoch, may run concurrently from different threads.
// abort() may be called at any time from any thread, also while another thread is blocked in
// Work::wait().
//
// Blocking. Collectives, send, recv and barrier never wait for peers: they check the
// arguments, enqueue the operation and return its Work. split() blocks until the sub-group
// is built (bounded by its timeout).
//
// Buffers. Tensors must be contiguous, of dtype f32, f64, bf16, i32, i64 or u8, on the
// backend's device (CPU for loopback, Gloo and MPI; the communicator's GPU for NCCL). From
// the call until Work::wait() returns or Work::done() is true, the operation owns them:
// do not write inputs or read outputs. The Work keeps the storage alive, so dropping the
// caller's handles early is safe. Outputs must not overlap inputs unless stated (all_reduce
// and broadcast are in place). After a failure or abort(), the contents of the buffers of
// unfinished operations are unspecified; MPI cannot cancel a started collective, so such
// buffers may still be written later and must not be reused.
//
// Errors. A call with invalid arguments (shape, dtype, counts, rank out of range) throws
// InternalError at once, before anything is sent. Communication failures surface from
// Work::wait(): PeerLostError when a peer died or closed its end, TimeoutError when the
// operation's timeout passed, CommError otherwise (abort() included). MPI without ULFM
// cannot outlive a dead process (mpirun ends the job), so there only TimeoutError is seen. The first failure is
// final: every later call returns a Work that rethrows it, and the ranks build a new
// communicator (a new epoch) to go on. Peers of a failed rank fail promptly too, at the
// latest at their own timeout; nothing waits forever.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual BackendKind backend() const = 0;
  // Default timeout of operations issued without one.
  virtual Millis timeout() const = 0;

  // In place: every rank's `tensor` becomes the element-wise reduction over all ranks.
  virtual Work all_reduce(const core::Tensor& tensor, const AllReduceOptions& opts = {}) = 0;

  // Reduces `input` (same numel on every rank, = sum of counts) element-wise over all ranks
  // and leaves part r, counts[r] elements starting at counts[0] + ... + counts[r-1], in
  // rank r's `output` (numel = counts[rank()]). Input is left unchanged.
  virtual Work reduce_scatter(const core::Tensor& output, const core::Tensor& input,
                              const ReduceScatterOptions& opts = {}) = 0;

  // Concatenates every rank's `input` in rank order into every rank's `output`
  // (numel = sum of counts).
  virtual Work all_gather(const core::Tensor& output, const core::Tensor& input,
                          const AllGatherOptions& opts = {}) = 0;

  // In place: every rank's `tensor` receives the root's. Same numel on every rank.
  virtual Work broadcast(const core::Tensor& tensor, const BroadcastOptions& opts = {}) = 0;

  // Personalised exchange. `input` holds input_counts[p] elements for peer p, packed in peer
  // order; `output` receives output_counts[p] elements from peer p, packed in peer order.
  // output_counts[p] on this rank must equal input_counts[rank()] on rank p (in particular
  // input_counts[rank()] == output_counts[rank()]); numel = sum of the counts.
  virtual Work all_to_all_v(const core::Tensor& output, const std::vector<int64_t>& output_counts,
                            const core::Tensor& input, const std::vector<int64_t>& input_counts,
                            const AllToAllOptions& opts = {}) = 0;

  // Sends `tensor`'s bytes to `peer` (which may be rank() itself, except on NCCL). Done once
  // the tensor may be reused: the bytes were delivered or handed to the transport.
  virtual Work send(const core::Tensor& tensor, int peer, const SendOptions& opts = {}) = 0;
  // Receives exactly tensor.nbytes() bytes from `peer` into `tensor`.
  virtual Work recv(const core::Tensor& tensor, int peer, const RecvOptions& opts = {}) = 0;

  // Done on a rank once every rank has entered the barrier.
  virtual Work barrier(const BarrierOptions& opts = {}) = 0;

  // Collective: partitions the ranks by `color`; within a colour, new ranks follow `key`, ties
  // broken by the old rank. Returns the sub-group's communicator, or nullptr for
  // color < 0. The sub-group is independent of its parent (either may be destroyed first)
  // and inherits its timeout. Throws the error of a failed exchange (the parent is then failed).
  virtual std::unique_ptr<Communicator> split(int color, int key,
                                              const SplitOptions& opts = {}) = 0;

  // Makes pending and future operations fail with CommError naming `reason`, and releases the
  // peers (they fail with PeerLostError or TimeoutError). Returns without waiting for pending
  // operations; idempotent; never throws. The communicator must still be destroyed.
  virtual void abort(const std::string& reason) noexcept = 0;
  // True after abort() (not after a failure).
  virtual bool aborted() const = 0;
};

}  // namespace weft::comm
