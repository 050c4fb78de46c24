// Loopback communicator (world of one): collectives reduce over one rank, so they are copies.
#include "comm/loopback.h"

#include "base/check.h"

namespace weft::comm {

std::unique_ptr<Communicator> make_loopback_communicator(const CommOptions& opts) {
  WEFT_CHECK(opts.rank == -1 || opts.rank == 0, "loopback: rank ", opts.rank,
             " (a world of one has rank 0)");
  WEFT_CHECK(opts.size == -1 || opts.size == 1, "loopback: size ", opts.size,
             " (loopback is a world of one)");
  return std::make_unique<LoopbackCommunicator>(opts.timeout);
}

LoopbackCommunicator::LoopbackCommunicator(Millis timeout)
    : Backend(BackendKind::kLoopback, 0, 1, timeout), mailbox_("loopback") {}

// Sum, max and min over one rank are the identity; avg divides by 1.
Work LoopbackCommunicator::do_all_reduce(const core::Tensor&, ReduceOp, Millis) {
  return Work::completed();
}

Work LoopbackCommunicator::do_reduce_scatter(const core::Tensor& output, const core::Tensor& input,
                                             ReduceOp, const std::vector<int64_t>&, Millis) {
  copy_bytes(output, input);
  return Work::completed();
}

Work LoopbackCommunicator::do_all_gather(const core::Tensor& output, const core::Tensor& input,
                                         const std::vector<int64_t>&, Millis) {
  copy_bytes(output, input);
  return Work::completed();
}

Work LoopbackCommunicator::do_broadcast(const core::Tensor&, int, Millis) {
  return Work::completed();
}

Work LoopbackCommunicator::do_all_to_all_v(const core::Tensor& output, const std::vector<int64_t>&,
                                           const core::Tensor& input, const std::vector<int64_t>&,
                                           Millis) {
  copy_bytes(output, input);
  return Work::completed();
}

Work LoopbackCommunicator::do_send(const core::Tensor& tensor, int, int tag, Millis) {
  return mailbox_.send(tensor, tag);
}

Work LoopbackCommunicator::do_recv(const core::Tensor& tensor, int, int tag, Millis timeout) {
  return mailbox_.recv(tensor, tag, timeout);
}

Work LoopbackCommunicator::do_barrier(Millis) { return Work::completed(); }

std::unique_ptr<Communicator> LoopbackCommunicator::do_split(int color, int, Millis) {
  if (color < 0) return nullptr;
  return std::make_unique<LoopbackCommunicator>(timeout());
}

void LoopbackCommunicator::do_abort(const std::string&) noexcept {
  mailbox_.fail_pending(failure());
}

}  // namespace weft::comm
