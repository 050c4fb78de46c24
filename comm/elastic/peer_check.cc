// The peer check's thread: keep a link to every other node of the record, and report the
// ones whose link closed and did not come back (peer_check.h).
#include "comm/elastic/peer_check.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "base/log.h"
#include "comm/elastic/membership_record.h"
#include "comm/elastic/peer_link.h"

namespace weft::comm {
namespace {

using Clock = std::chrono::steady_clock;

// How long the note of why a node was lost stays: survivors read it when they first find
// the alive key gone, within a poll or two.
constexpr Millis kLostNoteTtl{60'000};

double secs(Millis t) { return double(t.count()) / 1000; }

// One dial on a thread of its own, so that a node that does not answer (a blackholed
// address, a listener that never accepts) holds up no other node's check. It ends within
// its timeout, or at once when the check stops (the stop eventfd cancels it).
class Dial {
 public:
  Dial(const std::string& endpoint, const std::string& id, const std::string& token, Millis timeout,
       int cancel_fd, int done_fd) {
    thread_ = std::thread([=, this] {
      std::optional<PeerLink> link;
      std::string error;
      try {
        link = dial_peer(endpoint, id, token, timeout, cancel_fd);
      } catch (const std::exception& e) {
        error = e.what();
      }
      {
        std::lock_guard lock(mu_);
        link_ = std::move(link);
        error_ = std::move(error);
        done_ = true;
      }
      const uint64_t one = 1;
      (void)!::write(done_fd, &one, sizeof one);  // wakes the check's poll
    });
  }
  ~Dial() { thread_.join(); }
  Dial(const Dial&) = delete;
  Dial& operator=(const Dial&) = delete;

  bool done() {
    std::lock_guard lock(mu_);
    return done_;
  }
  // After done(): the link, or nullopt and the error.
  std::optional<PeerLink> take(std::string* error) {
    std::lock_guard lock(mu_);
    *error = error_;
    return std::move(link_);
  }

 private:
  std::mutex mu_;
  bool done_ = false;
  std::optional<PeerLink> link_;
  std::string error_;
  std::thread thread_;
};

struct Watched {
  std::string endpoint;
  PeerLink link;                            // open, or broken and kept for its pidfd
  std::optional<Clock::time_point> broken;  // when the link was seen closed
  std::unique_ptr<Dial> dial;               // in flight: the first link, or one back
  Clock::time_point next_redial{};          // a broken link's next dial, not before
  bool reported = false;
};

}  // namespace

PeerCheck::PeerCheck(Store& store, const Rendezvous& rdzv, PeerCheckOptions options)
    : store_(store), rdzv_(rdzv), options_(std::move(options)) {
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) throw IoError("peer check: no eventfd");
  thread_ = std::thread([this] { loop(); });
}

PeerCheck::~PeerCheck() {
  const uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(stop_fd_);
}

void PeerCheck::loop() {
  const std::string me = rdzv_.options().node_id;
  // Declared before the dials so that it outlives them: each writes to it when it ends.
  struct EventFd {
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ~EventFd() {
      if (fd >= 0) ::close(fd);
    }
  } dial_done;
  if (dial_done.fd < 0) {
    WEFT_WARN("elastic", "node ", me, "'s peer check has no eventfd: it does not run");
    return;
  }
  const int dial_fd = dial_done.fd;
  std::vector<std::unique_ptr<Dial>> retired;  // dials of nodes no longer watched
  std::map<std::string, Watched> nodes;
  auto next_refresh = Clock::now();
  bool store_failing = false;

  // The node's fate goes through the store: note the cause, then erase the alive key, as its
  // TTL would. Not when the key is gone already (the node left, or expired): nothing to say.
  auto report = [&](const std::string& id, Watched& w, const std::string& cause) {
    w.reported = true;
    try {
      if (!store_.check({rdzv_.alive_key(id)})) return;
      store_.set(rdzv_.lost_key(id), to_bytes(cause), kLostNoteTtl);
      store_.erase(rdzv_.alive_key(id));
    } catch (const std::exception& e) {
      // The TTL still ends it; the survivors then say so.
      WEFT_WARN("elastic", "node ", me, " cannot report node ", id, " lost (", cause,
                ") through the store: ", e.what());
      return;
    }
    reported_.fetch_add(1);
    WEFT_INFO("elastic", "node ", me, " reports node ", id, " lost: ", cause);
    if (options_.on_lost) options_.on_lost(id, cause);
  };

  for (;;) {
    const auto now = Clock::now();
    if (now >= next_refresh) {
      next_refresh = now + options_.refresh;
      try {
        std::set<std::string> ids;
        if (store_.check({rdzv_.state_key()})) {
          const MembershipRecord r =
              decode(to_string(store_.get(rdzv_.state_key())), rdzv_.state_key());
          for (const auto& [id, rank] : r.members) ids.insert(id);
          for (const auto& id : r.spares) ids.insert(id);
          for (const auto& [id, rank] : r.departed) ids.insert(id);
        }
        ids.erase(me);
        for (auto it = nodes.begin(); it != nodes.end();) {
          if (ids.count(it->first)) {
            ++it;
            continue;
          }
          // A dial still in flight finishes on its own (joined below), not on this thread.
          if (it->second.dial) retired.push_back(std::move(it->second.dial));
          it = nodes.erase(it);
        }
        for (const std::string& id : ids) {
          Watched& w = nodes[id];
          if (w.link.open() || w.reported || w.dial) continue;
          if (w.endpoint.empty() && store_.check({rdzv_.peer_key(id)}))
            w.endpoint = to_string(store_.get(rdzv_.peer_key(id)));
          if (w.endpoint.empty()) continue;  // not published yet
          w.dial = std::make_unique<Dial>(w.endpoint, id, options_.token, options_.dial_timeout,
                                          stop_fd_, dial_fd);
        }
        store_failing = false;
      } catch (const std::exception& e) {
        if (!store_failing)
          WEFT_WARN("elastic", "node ", me, "'s peer check cannot read the membership: ", e.what());
        store_failing = true;
      }
    }

    // Dials that ended since the last pass.
    uint64_t drained;
    (void)!::read(dial_fd, &drained, sizeof drained);
    std::erase_if(retired, [](const auto& d) { return d->done(); });
    for (auto& [id, w] : nodes) {
      if (!w.dial || !w.dial->done()) continue;
      std::string error;
      std::optional<PeerLink> link = w.dial->take(&error);
      w.dial.reset();
      if (w.reported) continue;
      if (!link) {
        // Not reachable yet (or any more): the TTL decides for a node never linked.
        if (!w.broken) WEFT_DEBUG("elastic", "node ", me, ": ", error);
        continue;
      }
      w.link = std::move(*link);
      if (w.broken) {
        w.broken.reset();
        reconnects_.fetch_add(1);
        WEFT_INFO("elastic", "node ", me, "'s peer connection to node ", id,
                  " is back within the grace");
      }
    }

    // Links that closed since the last pass; broken ones redial or run out of grace.
    int open = 0;
    for (auto& [id, w] : nodes) {
      if (w.reported || !w.link.open()) continue;
      if (!w.broken && w.link.broken()) {
        w.broken = Clock::now();
        WEFT_INFO("elastic", "node ", me, "'s peer connection to node ", id, " closed");
      }
      if (!w.broken) {
        ++open;
        continue;
      }
      if (w.link.process_gone()) {
        report(id, w,
               str("its agent's process exited (node ", me,
                   "'s peer connection to it closed, "
                   "and its pidfd says the process is gone)"));
        continue;
      }
      if (w.dial) continue;  // a dial back is in flight: its outcome decides
      if (Clock::now() - *w.broken >= options_.grace) {
        report(id, w,
               str("its peer connection closed (node ", me,
                   "'s connection to its agent closed "
                   "and did not come back within bound_key_grace ",
                   secs(options_.grace), " s: its process is gone)"));
        continue;
      }
      if (Clock::now() >= w.next_redial) {
        w.next_redial = Clock::now() + options_.redial;
        w.dial = std::make_unique<Dial>(
            w.endpoint, id, options_.token,
            std::min(options_.dial_timeout, std::max(options_.grace, options_.redial)), stop_fd_,
            dial_fd);
      }
    }
    watching_ = open;

    // Sleep until a link closes, a broken one's next redial, the next refresh, or stop.
    bool any_broken = false;
    std::vector<pollfd> fds = {{stop_fd_, POLLIN, 0}, {dial_fd, POLLIN, 0}};
    for (auto& [id, w] : nodes) {
      if (w.reported || !w.link.open()) continue;
      if (w.broken) {
        any_broken = true;
        if (w.link.pidfd >= 0) fds.push_back({w.link.pidfd, POLLIN, 0});
      } else {
        fds.push_back({w.link.fd, POLLIN, 0});
      }
    }
    auto wait = std::chrono::duration_cast<Millis>(next_refresh - Clock::now());
    if (any_broken) wait = std::min(wait, options_.redial);
    if (::poll(fds.data(), fds.size(), int(std::max<int64_t>(wait.count(), 0))) < 0 &&
        errno != EINTR)
      break;
    if (fds[0].revents) break;
  }
}

}  // namespace weft::comm
