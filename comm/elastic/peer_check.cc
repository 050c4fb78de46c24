// The peer check's thread: keep a link to every other node of the record, and report the
// ones whose link closed and did not come back (peer_check.h).
#include "comm/elastic/peer_check.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
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

struct Watched {
  std::string endpoint;
  PeerLink link;                            // open, or broken and kept for its pidfd
  std::optional<Clock::time_point> broken;  // when the link was seen closed
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
        std::erase_if(nodes, [&](const auto& n) { return !ids.count(n.first); });
        for (const std::string& id : ids) {
          Watched& w = nodes[id];
          if (w.link.open() || w.reported) continue;
          if (w.endpoint.empty() && store_.check({rdzv_.peer_key(id)}))
            w.endpoint = to_string(store_.get(rdzv_.peer_key(id)));
          if (w.endpoint.empty()) continue;  // not published yet
          try {
            w.link = dial_peer(w.endpoint, id, options_.token, options_.dial_timeout);
          } catch (const std::exception& e) {
            // Not reachable yet (or any more): the TTL decides for a node never linked.
            WEFT_DEBUG("elastic", "node ", me, ": ", e.what());
          }
        }
        store_failing = false;
      } catch (const std::exception& e) {
        if (!store_failing)
          WEFT_WARN("elastic", "node ", me, "'s peer check cannot read the membership: ", e.what());
        store_failing = true;
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
      try {
        PeerLink back =
            dial_peer(w.endpoint, id, options_.token,
                      std::min(options_.dial_timeout, std::max(options_.grace, options_.redial)));
        w.link = std::move(back);
        w.broken.reset();
        reconnects_.fetch_add(1);
        WEFT_INFO("elastic", "node ", me, "'s peer connection to node ", id,
                  " is back within the grace");
        ++open;
        continue;
      } catch (const std::exception&) {
      }
      if (Clock::now() - *w.broken >= options_.grace)
        report(id, w,
               str("its peer connection closed (node ", me,
                   "'s connection to its agent closed "
                   "and did not come back within bound_key_grace ",
                   secs(options_.grace), " s: its process is gone)"));
    }
    watching_ = open;

    // Sleep until a link closes, a broken one's next redial, the next refresh, or stop.
    bool any_broken = false;
    std::vector<pollfd> fds = {{stop_fd_, POLLIN, 0}};
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
