// Loopback: the communicator of a world of one, built everywhere without any engine. Every
// collective is a local copy (or nothing), messages to oneself go through a mailbox; it is
// what single-process runs use and the reference the other backends' size-1 paths match.
#pragma once

#include <memory>

#include "comm/backend.h"

namespace weft::comm {

// opts.rank and opts.size must be -1 or 0, and -1 or 1; the store is not used.
std::unique_ptr<Communicator> make_loopback_communicator(const CommOptions& opts);

class LoopbackCommunicator final : public Backend {
 public:
  explicit LoopbackCommunicator(Millis timeout);

 protected:
  Work do_all_reduce(const core::Tensor& tensor, ReduceOp op, Millis timeout) override;
  Work do_reduce_scatter(const core::Tensor& output, const core::Tensor& input, ReduceOp op,
                         const std::vector<int64_t>& counts, Millis timeout) override;
  Work do_all_gather(const core::Tensor& output, const core::Tensor& input,
                     const std::vector<int64_t>& counts, Millis timeout) override;
  Work do_broadcast(const core::Tensor& tensor, int root, Millis timeout) override;
  Work do_all_to_all_v(const core::Tensor& output, const std::vector<int64_t>& output_counts,
                       const core::Tensor& input, const std::vector<int64_t>& input_counts,
                       Millis timeout) override;
  Work do_send(const core::Tensor& tensor, int peer, int tag, Millis timeout) override;
  Work do_recv(const core::Tensor& tensor, int peer, int tag, Millis timeout) override;
  Work do_barrier(Millis timeout) override;
  std::unique_ptr<Communicator> do_split(int color, int key, Millis timeout) override;
  void do_abort(const std::string& reason) noexcept override;

 private:
  SelfMailbox mailbox_;
};

}  // namespace weft::comm
