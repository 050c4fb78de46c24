// MembershipWake: a thread parked on the membership record's next version, one parked on its
// nodes' alive keys going, and an eventfd.
#include "launch/membership_wake.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"

namespace weft::launch {

namespace {
// Sleeps `time`, or less when `stop` is requested.
void sleep_unless_stopped(const std::stop_token& stop, comm::Millis time) {
  std::mutex mu;
  std::condition_variable_any never;
  std::unique_lock lock(mu);
  never.wait_for(lock, stop, time, [] { return false; });
}
}  // namespace

MembershipWake::MembershipWake(comm::Store& store, const comm::Rendezvous& rdzv, comm::Millis retry)
    : store_(store), rdzv_(rdzv), retry_(retry) {
  fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) throw IoError("weft run: cannot create the membership wake's eventfd");
  thread_ = std::jthread([this](std::stop_token stop) { loop(stop); });
  if (store_.waits_for_absence())
    losses_ = std::jthread([this](std::stop_token stop) { watch_losses(stop); });
}

MembershipWake::~MembershipWake() {
  // Both stops first, so that the two waits end together; then the joins.
  thread_.request_stop();
  losses_.request_stop();
  if (thread_.joinable()) thread_.join();
  if (losses_.joinable()) losses_.join();
  ::close(fd_);
}

void MembershipWake::wake() {
  wakes_.fetch_add(1);  // before the write: whoever the write wakes sees the count
  const uint64_t one = 1;
  (void)!::write(fd_, &one, sizeof one);
}

std::stop_source MembershipWake::next_round() {
  std::lock_guard lock(round_mu_);
  round_ = std::stop_source();
  round_read_ = -1;
  return round_;  // shares the stop state: end_round() ends the caller's wait
}

void MembershipWake::round_read(int64_t version) {
  std::lock_guard lock(round_mu_);
  round_read_ = version;
}

void MembershipWake::end_round(int64_t version) {
  std::lock_guard lock(round_mu_);
  if (round_read_ < version) round_.request_stop();
}

void MembershipWake::loop(std::stop_token stop) {
  int64_t signalled = -1;  // the latest version a wake was sent for (or seen at the start)
  // A change seen: the supervisor looks, and the loss thread waits on the new record's keys.
  auto changed = [&](int64_t version) {
    if (signalled >= 0) wake();
    signalled = std::max(signalled, version);
    end_round(version);
  };
  while (!stop.stop_requested()) {
    try {
      const std::string key = rdzv_.state_key();
      const int64_t now = comm::decode(comm::to_string(store_.get(key)), key).version;
      // Written after the last wake and before this read: no wait would see it.
      if (now > signalled) changed(now);
      try {
        if (!store_.wait_stoppable({rdzv_.change_key(now + 1)}, kPark, stop)) return;
      } catch (const TimeoutError&) {
        continue;  // nothing changed for kPark: read the version again, park again
      }
      changed(now + 1);
    } catch (const std::exception&) {
      // The store is unreachable or slow: the monitor's own poll notices and says so.
      sleep_unless_stopped(stop, retry_);
    }
  }
}

void MembershipWake::watch_losses(std::stop_token stop) {
  // Keys seen gone under the record's version `seen_at`: not waited on again until the
  // record changes (the epoch without them is formed), or the wait would return at once.
  std::set<std::string> seen_gone;
  int64_t seen_at = -1;
  while (!stop.stop_requested()) {
    // Begun before the record is read: a change after this read ends the round's wait.
    std::stop_source round = next_round();
    std::stop_callback stopping(stop, [&round] { round.request_stop(); });
    try {
      const std::string key = rdzv_.state_key();
      const comm::MembershipRecord rec = comm::decode(comm::to_string(store_.get(key)), key);
      round_read(rec.version);
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
        sleep_unless_stopped(round.get_token(), kPark);
        continue;
      }
      std::optional<std::vector<std::string>> gone;
      try {
        gone = store_.wait_gone_stoppable(keys, kPark, round.get_token());
      } catch (const TimeoutError&) {
        continue;  // every key still there: read the record again, park again
      }
      if (!gone) continue;  // the record changed (or the destructor): read it again
      seen_gone.insert(gone->begin(), gone->end());
      loss_wakes_.fetch_add(1);
      wake();
    } catch (const std::exception&) {
      sleep_unless_stopped(stop, retry_);  // as loop(): the monitor's poll says why
    }
  }
}

}  // namespace weft::launch
