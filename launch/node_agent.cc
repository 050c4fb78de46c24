// The multi-node agent: rendezvous, the attempt loop, restart rounds, the exit barrier.
#include "launch/node_agent.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "base/error.h"
#include "base/check.h"
#include "comm/elastic/rendezvous.h"
#include "comm/store/auth.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"

namespace weft::launch {
namespace {

using Clock = std::chrono::steady_clock;

std::string hostname() {
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  return host;
}

comm::Millis millis(double s) { return comm::Millis(int64_t(s * 1000)); }
double seconds(comm::Millis t) { return double(t.count()) / 1000; }

// Where this agent listens when it hosts the store: the address it was given (loopback, or
// one of this machine's), or every interface for this machine's name (the other nodes must
// reach it, and a name may stand for several addresses).
std::string bind_host(const std::string& host) {
  if (host == "localhost" || host.empty()) return "127.0.0.1";
  in_addr ip{};
  if (host == "::1" || ::inet_pton(AF_INET, host.c_str(), &ip) == 1) return host;
  return "0.0.0.0";
}

comm::RendezvousOptions rendezvous_options(const RunOptions& o, const std::string& me) {
  comm::RendezvousOptions ro;
  ro.run_id = o.rdzv_id;
  ro.node_id = me;
  ro.min_nodes = o.nnodes_min;
  ro.max_nodes = o.nnodes_max;
  const RdzvConf& c = o.rdzv_conf;
  if (c.join_timeout) ro.join_timeout = millis(*c.join_timeout);
  if (c.last_call_timeout) ro.last_call = millis(*c.last_call_timeout);
  if (c.heartbeat_interval) ro.heartbeat_interval = millis(*c.heartbeat_interval);
  if (c.heartbeat_timeout) ro.heartbeat_timeout = millis(*c.heartbeat_timeout);
  ro.poll_interval = millis(o.monitor_interval);
  comm::validate(ro);
  return ro;
}

// Why the monitor stopped an attempt, and what the loop should do about it.
struct Stop {
  std::string why;
  bool restart = false;  // the job goes on in a new attempt
  bool failure = false;  // ... which uses one of --max-restarts (a failure, not a join)
  bool close = true;     // a fatal stop closes the job for the others (not a minority's)
  std::optional<comm::Membership> next;  // the new membership, when it changed
};

std::string node_list(const std::vector<std::string>& ids) {
  std::string s;
  for (const std::string& id : ids) s += (s.empty() ? "" : ", ") + id;
  return s;
}

// "membership changed: epoch 2 -> 3, 3 -> 2 nodes (lost a-12)" and whether a node was lost.
Stop membership_change(const comm::Membership& was, const comm::Membership& now) {
  std::vector<std::string> lost, joined;
  auto has = [](const comm::Membership& m, const std::string& id) {
    for (const comm::Member& x : m.members)
      if (x.node_id == id) return true;
    return false;
  };
  for (const comm::Member& x : was.members)
    if (!has(now, x.node_id)) lost.push_back(x.node_id);
  for (const comm::Member& x : now.members)
    if (!has(was, x.node_id)) joined.push_back(x.node_id);
  Stop s;
  s.why = str("membership changed: epoch ", was.epoch, " -> ", now.epoch, ", ", was.world(),
              " -> ", now.world(), " nodes");
  if (!lost.empty()) s.why += " (lost " + node_list(lost) + ")";
  if (!joined.empty()) s.why += " (joined " + node_list(joined) + ")";
  s.restart = true;
  s.failure = !lost.empty();
  s.next = now;
  return s;
}

class NodeAgent {
 public:
  NodeAgent(const RunOptions& o, SupervisorOptions so)
      : o_(o),
        so_(std::move(so)),
        me_(hostname() + "-" + std::to_string(::getpid())),
        token_(comm::auth::token_from_env()),
        port_(store_port_to_serve(o)),
        where_(o.rdzv_host + ":" + std::to_string(port_)),
        ro_(rendezvous_options(o, me_)),
        elastic_(o.nnodes_min != o.nnodes_max || o.max_restarts > 0),
        key_("rdzv/" + o.rdzv_id + "/") {}

  int run();

 private:
  void serve_store_if_first();
  comm::Membership join();
  comm::Membership settle();
  std::string monitor(const comm::Membership& m, int64_t round);
  Stop watch_elastic(const comm::Membership& m, int64_t round);
  Stop watch_fixed(const comm::Membership& m);
  bool finishing(const comm::Membership& m);
  void mark_exited(int rc);
  int finish(int rc, const std::string& verdict, bool close, const std::string& reason = "");
  std::string exited_key(const std::string& node) const { return prefix_ + "/exited/" + node; }

  const RunOptions& o_;
  SupervisorOptions so_;
  const std::string me_, token_;
  const int port_;
  const std::string where_;
  const comm::RendezvousOptions ro_;
  const bool elastic_;       // restarts or a node range: membership changes restart
  const std::string key_;    // "rdzv/<id>/"
  std::unique_ptr<comm::TCPStoreServer> server_;
  std::unique_ptr<comm::TCPStore> store_;
  std::unique_ptr<comm::Rendezvous> rdzv_;
  std::string store_node_ = "?";
  std::string prefix_;  // this attempt's store prefix
  std::optional<comm::Membership> last_;  // the membership of the latest attempt
  Stop stop_;           // why the monitor stopped the current attempt
};

// torchrun's rule: on the endpoint's machine the first agent to bind the port hosts the
// store; a taken port means another agent hosts it, so connect like everyone else.
void NodeAgent::serve_store_if_first() {
  if (!is_local_host(o_.rdzv_host)) return;
  comm::TCPStoreServerOptions sso;
  sso.host = bind_host(o_.rdzv_host);
  sso.port = uint16_t(port_);
  sso.token = token_;
  sso.insecure = o_.rdzv_conf.insecure.value_or(false) && token_.empty();
  try {
    server_ = std::make_unique<comm::TCPStoreServer>(sso);
    std::fprintf(stderr, "weft run: node %s serves the rendezvous store on %s:%d\n", me_.c_str(),
                 sso.host.c_str(), port_);
  } catch (const comm::AddressInUseError&) {
  }
}

// rdzv.join(), again while this node waits as a spare of a full membership (a spare waits
// for a member to go, however long that takes; join_timeout bounds only a rendezvous that
// lacks nodes).
comm::Membership NodeAgent::join() {
  for (bool said = false;;) {
    try {
      return rdzv_->join();
    } catch (const TimeoutError&) {
      comm::MembershipRecord r = rdzv_->read_record();
      const bool spare = !r.closed && r.epoch > 0 && int(r.members.size()) >= ro_.max_nodes;
      if (!spare) throw;
      if (!said)
        std::fprintf(stderr,
                     "weft run: node %s waits as a spare: the membership of epoch %lld is full "
                     "at %d nodes (--nnodes %d:%d)\n",
                     me_.c_str(), (long long)r.epoch, ro_.max_nodes, ro_.min_nodes, ro_.max_nodes);
      said = true;
    }
  }
}

// After a failure here: the membership the next attempt runs in. Waits until every member
// of the current epoch is alive again (a lost one is re-formed away by poll_change once its
// heartbeat expired), at most join_timeout (then poll_change throws).
comm::Membership NodeAgent::settle() {
  for (;;) {
    if (std::optional<comm::Membership> next = rdzv_->poll_change()) return *next;
    comm::Membership m = *rdzv_->membership();
    bool all = true;
    for (const comm::Member& x : m.members)
      all = all && (x.node_id == me_ || store_->check({rdzv_->alive_key(x.node_id)}));
    if (all) return m;
    std::this_thread::sleep_for(ro_.poll_interval);
  }
}

// A member of this attempt finished (all its workers exited 0): the job is ending, and a
// membership change now is that node leaving, not a reason to restart.
bool NodeAgent::finishing(const comm::Membership& m) {
  for (const comm::Member& x : m.members)
    if (x.node_id != me_ && store_->check({exited_key(x.node_id)}) &&
        comm::to_string(store_->get(exited_key(x.node_id))) == "0")
      return true;
  return false;
}

// Elastic: a restart round asked for by another node, or a new membership epoch.
Stop NodeAgent::watch_elastic(const comm::Membership& m, int64_t round) {
  if (finishing(m)) return {};
  const int64_t now = store_->add(key_ + "round", 0);
  if (now > round) {
    const std::string why_key = key_ + "round_reason/" + std::to_string(now);
    std::string why = store_->check({why_key}) ? comm::to_string(store_->get(why_key)) : "";
    return Stop{"restart round " + std::to_string(now) + " asked for by " +
                    (why.empty() ? "another node" : why),
                true, true, true, std::nullopt};
  }
  if (std::optional<comm::Membership> next = rdzv_->poll_change())
    return membership_change(m, *next);
  return {};
}

// A fixed count without restarts: another node's failure closes the rendezvous with its
// reason; a node whose heartbeat expired without its exit mark is lost (and this agent
// closes the job for the rest).
Stop NodeAgent::watch_fixed(const comm::Membership& m) {
  comm::MembershipRecord r = rdzv_->read_record();
  if (r.closed) return {"the job was stopped by another node: " + r.close_reason};
  for (const comm::Member& x : m.members) {
    if (x.node_id == me_ || store_->check({rdzv_->alive_key(x.node_id)}) ||
        store_->check({exited_key(x.node_id)}))
      continue;
    std::string why = str("lost node ", x.node_id, " (node rank ", x.node_rank,
                          "): its heartbeat expired (none for ", seconds(ro_.heartbeat_timeout),
                          " s)");
    rdzv_->close(why);
    return {why};
  }
  return {};
}

std::string NodeAgent::monitor(const comm::Membership& m, int64_t round) {
  const auto t0 = Clock::now();
  try {
    stop_ = elastic_ ? watch_elastic(m, round) : watch_fixed(m);
  } catch (const comm::QuorumLostError& e) {
    stop_ = Stop{e.what(), false, false, /*close=*/false};
  } catch (const comm::RendezvousClosedError& e) {
    stop_ = Stop{std::string("the job was stopped by another node: ") + e.what()};
  } catch (const TimeoutError& e) {
    // The store left a call unanswered for its whole reply timeout (heartbeat_timeout, see
    // run()): this node's lease cannot be renewed either, so the others re-form without it.
    // It stops without closing the job: the job is the majority's, and a close sent once a
    // partition heals would end it. Otherwise the rendezvous gave up re-forming: fatal.
    if (Clock::now() - t0 >= store_->timeout())
      stop_ = Stop{str("node ", me_, " lost quorum: the rendezvous store at ", where_,
                       " (hosted by node ", store_node_, ") did not answer it within ",
                       seconds(ro_.heartbeat_timeout),
                       " s (heartbeat_timeout): it is cut off from the store (a partition: the "
                       "others re-form without it once its heartbeat expires), or the store's "
                       "host hangs; it stops itself so that there is never a split brain (",
                       e.what(), ")"),
                   false, false, /*close=*/false};
    else
      stop_ = Stop{e.what()};
  } catch (const std::exception& e) {
    stop_ = Stop{str("lost the rendezvous store at ", where_, " (hosted by node ", store_node_,
                     ", which is gone or unreachable): ", e.what()),
                 false, false, false};
  }
  return stop_.why;
}

void NodeAgent::mark_exited(int rc) {
  try {
    if (!prefix_.empty()) store_->set(exited_key(me_), comm::to_bytes(std::to_string(rc)));
  } catch (const std::exception&) {
  }
}

// Ends this node's part: prints the verdict, closes the job for the others on a failure
// with `reason` (default: the verdict; the first reason stays; a minority or a lost store
// does not close), marks this node exited, waits for the others before taking the store
// away, and returns `rc`.
int NodeAgent::finish(int rc, const std::string& verdict, bool close, const std::string& reason) {
  if (!verdict.empty()) std::fprintf(stderr, "weft run: failed: %s\n", verdict.c_str());
  try {
    if (rc != 0 && close) rdzv_->close(str("node ", me_, ": ", reason.empty() ? verdict : reason));
  } catch (const std::exception&) {
  }
  mark_exited(rc);
  // The exit barrier: keep beating until the other members exited too (or are gone), so
  // that none of them mistakes this node's end for a loss, and, on the store's host, so
  // that none mistakes the end of the job for a lost store.
  const auto until = Clock::now() + millis(so_.settle_s + o_.grace + 10);
  if (last_ && (rc == 0 || server_))
    for (const comm::Member& x : last_->members)
      try {
        while (x.node_id != me_ && Clock::now() < until && !store_->check({exited_key(x.node_id)}) &&
               store_->check({rdzv_->alive_key(x.node_id)}))
          std::this_thread::sleep_for(ro_.poll_interval);
      } catch (const std::exception&) {
        break;
      }
  rdzv_->heartbeat().stop_and_erase();
  return rc;
}

int NodeAgent::run() {
  serve_store_if_first();
  const auto t0 = Clock::now();
  store_ = std::make_unique<comm::TCPStore>(
      comm::TCPStoreOptions{o_.rdzv_host, uint16_t(port_), ro_.join_timeout, token_});
  const std::string host_key = key_ + "store_node";
  if (server_) store_->set(host_key, comm::to_bytes(me_));
  rdzv_ = std::make_unique<comm::Rendezvous>(*store_, ro_);
  comm::Membership m = join();
  if (store_->check({host_key})) store_node_ = comm::to_string(store_->get(host_key));
  // A member waits for a store reply no longer than its lease: a node the store cannot
  // answer for heartbeat_timeout is lost to the others by then, so it must stop too, not
  // wait join_timeout per call (default 600 s) while they go on without it (monitor()).
  store_->set_timeout(ro_.heartbeat_timeout);
  std::fprintf(stderr,
               "weft run: node %s is node %d of %d (rendezvous %s at %s, epoch %lld) after "
               "%.2f s\n",
               me_.c_str(), m.index, m.world(), o_.rdzv_id.c_str(), where_.c_str(),
               (long long)m.epoch, std::chrono::duration<double>(Clock::now() - t0).count());
  std::fflush(stderr);

  if (!token_.empty()) ::setenv("WEFT_JOB_TOKEN", token_.c_str(), 1);
  so_.store_host = o_.rdzv_host;
  so_.store_port = port_;
  so_.monitor_interval_s = o_.monitor_interval;
  so_.settle_s = seconds(ro_.heartbeat_timeout) + 2 * seconds(ro_.poll_interval) + 1;
  so_.max_restarts = o_.max_restarts;
  so_.nnodes_min = o_.nnodes_min;
  so_.nnodes_max = o_.nnodes_max;
  const std::string round_key = key_ + "round";
  int failures = 0;  // restarts used by failures, against --max-restarts
  for (;;) {
    const int64_t round = store_->add(round_key, 0);
    prefix_ = m.store_prefix + "/round/" + std::to_string(round);
    last_ = m;
    so_.node_index = m.index;
    so_.nnodes = m.world();
    so_.store_prefix = prefix_;
    so_.rdzv_epoch = m.epoch;
    so_.restart_count = int(m.epoch - 1 + round);
    stop_ = Stop{};
    so_.monitor = [&] { return monitor(m, round); };
    const Outcome out = supervise(so_);

    Stop next;
    switch (out.end) {
      case Outcome::End::kSucceeded:
        return finish(0, "", false);
      case Outcome::End::kSignalled:
        return finish(out.code, out.verdict, true);
      case Outcome::End::kStopped:
        next = stop_;
        if (!next.restart) return finish(out.code, out.verdict, next.close);
        break;
      case Outcome::End::kFailed:
        if (!elastic_ || failures >= o_.max_restarts) break;
        next.why = str("node ", me_, ": ", out.cause);
        next.restart = next.failure = true;
        // Ask every node for the next round (once: a node that lost the race to bump it
        // restarts in the round another node asked for).
        try {
          store_->set(key_ + "round_reason/" + std::to_string(round + 1), comm::to_bytes(next.why));
          store_->compare_set(round_key, comm::to_bytes(std::to_string(round)),
                              comm::to_bytes(std::to_string(round + 1)));
        } catch (const std::exception& e) {
          return finish(out.code, out.verdict + "; and could not ask for a restart: " + e.what(), false);
        }
        break;
    }
    if (!next.restart) return finish(out.code, out.verdict, true, out.cause);
    if (next.failure && failures >= o_.max_restarts)
      return finish(1, next.why + str("; no restarts left (--max-restarts ", o_.max_restarts, ")"),
                    true);
    if (next.failure) ++failures;
    if (stop_requested()) return finish(130, "stopped by a signal between attempts", true);
    std::fprintf(stderr, "weft run: %s; restarting the workers (%d of --max-restarts %d used)\n",
                 next.why.c_str(), failures, o_.max_restarts);
    mark_exited(-1);  // this attempt is over here; not "finished"
    try {
      m = next.next ? *next.next : settle();
    } catch (const comm::QuorumLostError& e) {
      return finish(1, e.what(), false);
    } catch (const std::exception& e) {
      return finish(1, e.what(), true);
    }
    std::fprintf(stderr, "weft run: node %s is node %d of %d (epoch %lld)\n", me_.c_str(), m.index,
                 m.world(), (long long)m.epoch);
  }
}

}  // namespace

int run_node_agent(const RunOptions& o, SupervisorOptions so) {
  check_rendezvous_options(o);
  return NodeAgent(o, std::move(so)).run();
}

}  // namespace weft::launch
