// MembershipWake: a thread parked on the membership record's next version, and an eventfd.
#include "launch/membership_wake.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "base/error.h"

namespace weft::launch {

MembershipWake::MembershipWake(comm::Store& store, const comm::Rendezvous& rdzv,
                               comm::Millis park)
    : store_(store), rdzv_(rdzv), park_(park) {
  fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) throw IoError("weft run: cannot create the membership wake's eventfd");
  thread_ = std::thread([this] { loop(); });
}

MembershipWake::~MembershipWake() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
}

void MembershipWake::wake() {
  const uint64_t one = 1;
  (void)!::write(fd_, &one, sizeof one);
  wakes_.fetch_add(1);
}

void MembershipWake::loop() {
  int64_t signalled = -1;  // the latest version a wake was sent for (or seen at the start)
  while (!stop_.load()) {
    try {
      const std::string key = rdzv_.state_key();
      const int64_t now = comm::decode(comm::to_string(store_.get(key)), key).version;
      // Written after the last wake and before this read: no wait would see it.
      if (signalled >= 0 && now > signalled) wake();
      signalled = std::max(signalled, now);
      try {
        store_.wait({rdzv_.change_key(now + 1)}, park_);
      } catch (const TimeoutError&) {
        continue;  // no change in this slice: read the version again, park again
      }
      wake();
      signalled = std::max(signalled, now + 1);
    } catch (const std::exception&) {
      // The store is unreachable or slow: the monitor's own poll notices and says so.
      std::this_thread::sleep_for(park_);
    }
  }
}

}  // namespace weft::launch
