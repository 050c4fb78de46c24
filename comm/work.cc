// Work and Completion: the asynchronous handle shared by every backend.
#include "comm/work.h"

#include "base/check.h"
#include "base/error.h"

namespace weft::comm {

namespace {

// A Work that finished with an error before it started (a failed communicator).
class FailedWork : public WorkImpl {
 public:
  explicit FailedWork(std::exception_ptr error) : error_(std::move(error)) {}
  bool done() override { return true; }
  void wait_until(std::optional<Clock::time_point>) override { std::rethrow_exception(error_); }

 private:
  std::exception_ptr error_;
};

}  // namespace

Work Work::failed(std::exception_ptr error) {
  WEFT_CHECK(error != nullptr, "Work::failed needs an error");
  return Work(std::make_shared<FailedWork>(std::move(error)));
}

void Work::wait(std::optional<Millis> timeout) const {
  if (!impl_) return;
  std::optional<Clock::time_point> deadline;
  if (timeout) deadline = Clock::now() + *timeout;
  impl_->wait_until(deadline);
}

void Completion::complete() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
  }
  cv_.notify_all();
}

void Completion::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

bool Completion::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

bool Completion::await(std::optional<Clock::time_point> deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!deadline) {
    cv_.wait(lock, [&] { return finished_; });
    return true;
  }
  return cv_.wait_until(lock, *deadline, [&] { return finished_; });
}

void Completion::wait_until(std::optional<Clock::time_point> deadline) {
  if (!await(deadline))
    throw TimeoutError(str("Work::wait: ", what_, " still running at the wait's timeout"));
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace weft::comm
