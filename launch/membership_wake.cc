// MembershipWake: a thread parked on the membership record's next version, one parked on its
// nodes' alive keys going, and an eventfd.
#include "launch/membership_wake.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"

namespace weft::launch {

MembershipWake::MembershipWake(comm::Store& store, const comm::Rendezvous& rdzv, comm::Millis park)
    : store_(store), rdzv_(rdzv), park_(park) {
  fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) throw IoError("weft run: cannot create the membership wake's eventfd");
  thread_ = std::thread([this] { loop(); });
  if (store_.waits_for_absence()) losses_ = std::thread([this] { watch_losses(); });
}

MembershipWake::~MembershipWake() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (losses_.joinable()) losses_.join();
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

void MembershipWake::watch_losses() {
  // Keys seen gone under the record's version `seen_at`: not waited on again until the
  // record changes (the epoch without them is formed), or the wait would return at once.
  std::set<std::string> seen_gone;
  int64_t seen_at = -1;
  while (!stop_.load()) {
    try {
      const std::string key = rdzv_.state_key();
      const comm::MembershipRecord rec = comm::decode(comm::to_string(store_.get(key)), key);
      if (rec.version != seen_at) {
        seen_gone.clear();
        seen_at = rec.version;
      }
      std::vector<std::string> keys;
      for (const auto& [id, rank] : rec.members) keys.push_back(rdzv_.alive_key(id));
      for (const auto& id : rec.spares) keys.push_back(rdzv_.alive_key(id));
      // A departing node's key goes when it dies before confirming its hand-over (an epoch
      // then forms without it) or right after it confirmed (a look that finds no change).
      for (const auto& [id, rank] : rec.departed) keys.push_back(rdzv_.alive_key(id));
      std::erase_if(keys, [&](const std::string& k) { return seen_gone.count(k) > 0; });
      if (keys.empty()) {
        // Nothing to watch until the record changes (a node alone, or every other gone).
        std::this_thread::sleep_for(park_);
        continue;
      }
      std::vector<std::string> gone;
      try {
        gone = store_.wait_gone(keys, park_);
      } catch (const TimeoutError&) {
        continue;  // every key still there: read the record again, park again
      }
      seen_gone.insert(gone.begin(), gone.end());
      loss_wakes_.fetch_add(1);
      wake();
    } catch (const std::exception&) {
      std::this_thread::sleep_for(park_);  // as loop(): the monitor's poll says why
    }
  }
}

}  // namespace weft::launch
