// The process's helper thread of split_in_two (split_in_two.h).
#include "checkpoint/split_in_two.h"

#include <unistd.h>

#include <utility>

namespace weft::checkpoint {

SplitHelper& SplitHelper::get() {
  static std::mutex mu;
  static SplitHelper* helper = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> l(mu);
  // A child forked after the helper started has its memory but not its thread: it starts its
  // own (the parent's object is left as it is, its mutex possibly held at the fork).
  if (!helper || owner != ::getpid()) {
    helper = new SplitHelper();
    owner = ::getpid();
  }
  return *helper;
}

SplitHelper::SplitHelper() : thread_([this] { loop(); }) {}

bool SplitHelper::post(const std::function<void()>* work) {
  std::lock_guard<std::mutex> l(mu_);
  if (posted_ || running_) return false;
  posted_ = work;
  cv_.notify_all();
  return true;
}

void SplitHelper::finish(const std::function<void()>* work) {
  std::unique_lock<std::mutex> l(mu_);
  if (posted_ == work) {
    posted_ = nullptr;
    return;
  }
  cv_.wait(l, [&] { return running_ != work; });
}

void SplitHelper::loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return posted_ != nullptr; });
    running_ = std::exchange(posted_, nullptr);
    l.unlock();
    (*running_)();
    l.lock();
    running_ = nullptr;
    cv_.notify_all();
  }
}

}  // namespace weft::checkpoint
