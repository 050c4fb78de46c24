// Implementers' API (after ggml's ggml-backend-impl.h): a backend derives from Backend, which
// checks every argument once, resolves defaults (timeouts, counts), keeps the failed/aborted
// state, and calls the do_* hooks with arguments that are known to be consistent locally.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/work.h"
#include "core/tensor.h"

namespace weft::comm {

class Backend : public Communicator {
 public:
  ~Backend() override = default;

  int rank() const final { return rank_; }
  int size() const final { return size_; }
  BackendKind backend() const final { return kind_; }
  Millis timeout() const final { return timeout_; }

  Work all_reduce(const core::Tensor& tensor, const AllReduceOptions& opts) final;
  Work reduce_scatter(const core::Tensor& output, const core::Tensor& input,
                      const ReduceScatterOptions& opts) final;
  Work all_gather(const core::Tensor& output, const core::Tensor& input,
                  const AllGatherOptions& opts) final;
  Work broadcast(const core::Tensor& tensor, const BroadcastOptions& opts) final;
  Work all_to_all_v(const core::Tensor& output, const std::vector<int64_t>& output_counts,
                    const core::Tensor& input, const std::vector<int64_t>& input_counts,
                    const AllToAllOptions& opts) final;
  Work send(const core::Tensor& tensor, int peer, const SendOptions& opts) final;
  Work recv(const core::Tensor& tensor, int peer, const RecvOptions& opts) final;
  Work barrier(const BarrierOptions& opts) final;
  std::unique_ptr<Communicator> split(int color, int key, const SplitOptions& opts) final;
  void abort(const std::string& reason) noexcept final;
  bool aborted() const final { return aborted_.load(); }

 protected:
  Backend(BackendKind kind, int rank, int size, Millis timeout);

  // Hooks. Arguments are checked: tensors contiguous, supported dtype, accepted by
  // check_buffer(); counts have size() entries that add up to the numels; peers and roots in
  // range; the communicator was neither failed nor aborted at the call. A hook may throw
  // CommError (it becomes a failed Work); it must not block on peers.
  virtual Work do_all_reduce(const core::Tensor& tensor, ReduceOp op, Millis timeout) = 0;
  virtual Work do_reduce_scatter(const core::Tensor& output, const core::Tensor& input, ReduceOp op,
                                 const std::vector<int64_t>& counts, Millis timeout) = 0;
  virtual Work do_all_gather(const core::Tensor& output, const core::Tensor& input,
                             const std::vector<int64_t>& counts, Millis timeout) = 0;
  virtual Work do_broadcast(const core::Tensor& tensor, int root, Millis timeout) = 0;
  virtual Work do_all_to_all_v(const core::Tensor& output,
                               const std::vector<int64_t>& output_counts, const core::Tensor& input,
                               const std::vector<int64_t>& input_counts, Millis timeout) = 0;
  virtual Work do_send(const core::Tensor& tensor, int peer, int tag, Millis timeout) = 0;
  virtual Work do_recv(const core::Tensor& tensor, int peer, int tag, Millis timeout) = 0;
  virtual Work do_barrier(Millis timeout) = 0;
  // Blocking; may throw CommError and its subclasses.
  virtual std::unique_ptr<Communicator> do_split(int color, int key, Millis timeout) = 0;
  // Called once, after aborted() became true and failure() returns the abort error. Must not
  // block on peers or throw.
  virtual void do_abort(const std::string& reason) noexcept = 0;
  // Throws InternalError when the backend cannot use this tensor's memory (wrong device).
  virtual void check_buffer(const core::Tensor& tensor, const char* what) const;

  // The first failure is final (see the contract in communicator.h); later ones are ignored.
  void set_failed(std::exception_ptr error) noexcept;
  // The abort error, else the first failure, else null.
  std::exception_ptr failure() const;
  // "gloo all_reduce f32[1024] rank 1/4": names an operation in messages.
  std::string describe(const char* op, const core::Tensor* tensor = nullptr) const;

 private:
  template <typename Fn>
  Work guarded(Fn&& fn);

  const BackendKind kind_;
  const int rank_;
  const int size_;
  const Millis timeout_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::exception_ptr failure_;
  std::exception_ptr abort_error_;
};

const char* backend_name(BackendKind kind);

// counts for a balanced split of `numel` into `parts` (the first numel % parts get one more).
std::vector<int64_t> balanced_counts(int64_t numel, int parts);
// Exclusive prefix sums: where each part starts.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts);
// memcpy of src's bytes into dst (same nbytes, both contiguous, both host memory).
void copy_bytes(const core::Tensor& dst, const core::Tensor& src);

// Who is in which sub-group, computed identically on every rank from all ranks' (color, key).
struct SplitPlan {
  int color = kNoColor;
  int rank = -1;             // in the sub-group; -1 without a colour
  std::vector<int> members;  // old ranks, in new-rank order
};
SplitPlan plan_split(const std::vector<int64_t>& color_key_by_rank, int my_rank);
// Exchanges (color, key) over `parent` with an all_gather and plans the split. Blocking.
SplitPlan exchange_split(Communicator& parent, int color, int key, Millis timeout);

// Messages a rank sends to itself (world of one, or peer == rank in Gloo): a send copies its
// bytes at once and is done; a recv completes when a message with its tag is there (FIFO per
// tag), and fails with TimeoutError when none came within its timeout. A size mismatch fails
// the recv with CommError. Works stay valid after the mailbox is gone.
class SelfMailbox {
 public:
  explicit SelfMailbox(std::string owner);
  Work send(const core::Tensor& tensor, int tag);
  Work recv(const core::Tensor& tensor, int tag, Millis timeout);
  // Fails every pending recv (abort, destruction).
  void fail_pending(std::exception_ptr error);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace weft::comm
