// Work: the handle an asynchronous communication call returns (after pytorch's c10d Work):
// poll it with done(), block with wait(), which rethrows the operation's error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace weft::comm {

using Millis = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Implementers' side of a Work. A backend either completes a Completion (below) from its own
// thread, or implements this to drive a foreign engine (MPI_Test, cudaEventQuery).
class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  // True once the operation has finished, successfully or not. Never blocks, never throws;
  // may advance the engine's progress.
  virtual bool done() = 0;
  // Blocks until the operation finishes or `deadline` passes (none: until it finishes).
  // Rethrows the operation's error (every time it is called); throws TimeoutError at the
  // deadline while the operation goes on. Thread-safe.
  virtual void wait_until(std::optional<Clock::time_point> deadline) = 0;
};

// The handle. Copies share one operation. A default-constructed Work is already done.
//
// Contract:
// - done() never blocks and never throws; true after success and after failure alike.
// - wait(timeout) blocks until the operation finishes; it returns on success and rethrows the
//   operation's error otherwise (CommError, PeerLostError, TimeoutError), on every call.
//   With a timeout it throws TimeoutError when the operation is still running at that point;
//   the operation then goes on and still owns its buffers (wait again, or abort the
//   communicator). Without one it relies on the operation's own timeout, so it cannot hang.
// - Any thread may wait on or poll any Work, several at once.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkImpl> impl) : impl_(std::move(impl)) {}

  static Work completed() { return Work(); }
  // A Work that is done and rethrows `error` (not null) on wait().
  static Work failed(std::exception_ptr error);

  bool done() const { return !impl_ || impl_->done(); }
  void wait(std::optional<Millis> timeout = std::nullopt) const;

 private:
  std::shared_ptr<WorkImpl> impl_;
};

// A WorkImpl completed by whoever runs the operation (a worker thread, a matching send).
// The first of complete()/fail() wins; later calls are ignored, so an abort and a late
// success cannot both be observed.
class Completion : public WorkImpl {
 public:
  // `what` names the operation in timeout messages ("gloo all_reduce f32[1024] rank 1/4").
  explicit Completion(std::string what) : what_(std::move(what)) {}

  void complete();
  void fail(std::exception_ptr error);
  bool finished() const;
  // Blocks until finished or the deadline; true when finished. Never throws.
  bool await(std::optional<Clock::time_point> deadline);

  bool done() override { return finished(); }
  void wait_until(std::optional<Clock::time_point> deadline) override;

 private:
  std::string what_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::exception_ptr error_;
};

}  // namespace weft::comm
