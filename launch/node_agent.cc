// The multi-node agent: rendezvous, the attempt loop, restart rounds, the exit barrier.
#include "launch/node_agent.h"

#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "base/check.h"
#include "base/env.h"
#include "base/error.h"
#include "base/host.h"
#include "checkpoint/snapshot_stripes.h"
#include "comm/elastic/peer_check.h"
#include "comm/elastic/peer_link.h"
#include "comm/elastic/rendezvous.h"
#include "comm/store/auth.h"
#include "comm/store/etcd_store.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "launch/elastic_worker.h"
#include "launch/epoch_notice.h"
#include "launch/membership_wake.h"
#include "launch/scratch_dir.h"
#include "launch/snapshot_agent_launch.h"
#include "parallel/launch_env.h"

namespace weft::launch {
namespace {

using Clock = std::chrono::steady_clock;

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

// The job token: --rdzv-conf token_file, else WEFT_JOB_TOKEN / WEFT_JOB_TOKEN_FILE.
std::string job_token(const RunOptions& o) {
  if (o.rdzv_conf.token_file)
    return comm::auth::read_token_file(*o.rdzv_conf.token_file, "--rdzv-conf token_file");
  return comm::auth::token_from_env();
}

// Where the rendezvous store is: --rdzv-endpoint's host, or node 0's (--master-addr) with
// the static backend.
std::string store_host(const RunOptions& o) {
  return o.rdzv_backend == RdzvBackend::kStatic ? o.master_addr : o.rdzv_host;
}

// The job's id: --rdzv-id; the static backend may go without one (torchrun's "none").
std::string run_id(const RunOptions& o) {
  return o.rdzv_id.empty() && o.rdzv_backend == RdzvBackend::kStatic ? "static" : o.rdzv_id;
}

std::string where(const RunOptions& o, int port) {
  if (o.rdzv_backend != RdzvBackend::kEtcd) return store_host(o) + ":" + std::to_string(port);
  std::string list;
  for (const std::string& e : o.rdzv_endpoints) list += (list.empty() ? "" : ",") + e;
  return "etcd " + list;
}

comm::RendezvousOptions rendezvous_options(const RunOptions& o, const std::string& me) {
  comm::RendezvousOptions ro;
  ro.run_id = run_id(o);
  ro.node_id = me;
  ro.min_nodes = o.nnodes_min;
  ro.max_nodes = o.nnodes_max;
  const RdzvConf& c = o.rdzv_conf;
  if (c.join_timeout || c.timeout) ro.join_timeout = millis(c.join_timeout ? *c.join_timeout : *c.timeout);
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

// "membership changed: epoch 2 -> 3, 3 -> 2 nodes (lost a-12)" and whether a node was lost;
// a renewal names the workers replaced in place (`nproc` workers per node).
Stop membership_change(const comm::Membership& was, const comm::Membership& now, int nproc) {
  std::vector<std::string> lost, joined;
  auto has = [](const comm::Membership& m, const std::string& id) {
    for (const comm::Member& x : m.members)
      if (x.node_id == id) return true;
    return false;
  };
  std::vector<std::string> left;
  for (const comm::Member& x : was.members) {
    if (has(now, x.node_id)) continue;
    bool gone_gracefully = false;
    for (const comm::Member& y : now.departed) gone_gracefully = gone_gracefully || y.node_id == x.node_id;
    (gone_gracefully ? left : lost).push_back(x.node_id);
  }
  for (const comm::Member& x : now.members)
    if (!has(was, x.node_id)) joined.push_back(x.node_id);
  Stop s;
  s.why = str("membership changed: epoch ", was.epoch, " -> ", now.epoch, ", ", was.world(),
              " -> ", now.world(), " nodes");
  if (!lost.empty()) s.why += " (lost " + node_list(lost) + ")";
  if (!left.empty()) s.why += " (left " + node_list(left) + ")";
  if (!joined.empty()) s.why += " (joined " + node_list(joined) + ")";
  for (const auto& [local, id] : now.replaced) {
    int index = 0;
    for (size_t i = 0; i < now.members.size(); ++i)
      if (now.members[i].node_id == id) index = int(i);
    s.why += str(" (rank ", index * nproc + local, " of node ", id, " replaced by a new worker)");
  }
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
        me_(host_name() + "-" + std::to_string(::getpid())),
        token_(job_token(o)),
        port_(store_port_to_serve(o)),
        where_(where(o, port_)),
        ro_(rendezvous_options(o, me_)),
        elastic_(o.nnodes_min != o.nnodes_max || o.max_restarts > 0),
        etcd_(o.rdzv_backend == RdzvBackend::kEtcd),
        static_(o.rdzv_backend == RdzvBackend::kStatic),
        host_(store_host(o)),
        key_("rdzv/" + run_id(o) + "/") {}
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  int run();

 private:
  void serve_store_if_first();
  // The agent's store get()/connect timeout: --rdzv-conf read_timeout, else join_timeout.
  comm::Millis store_timeout() const {
    return o_.rdzv_conf.read_timeout ? millis(*o_.rdzv_conf.read_timeout) : ro_.join_timeout;
  }
  void claim_static_rank();
  void connect_store();
  std::unique_ptr<comm::Store> another_connection();  // to the rendezvous store
  void place_workers_store(const comm::Membership& m);
  comm::Membership join();
  comm::Membership settle();
  std::string monitor(const comm::Membership& m, int64_t round);
  Stop watch_elastic(const comm::Membership& m, int64_t round);
  Stop watch_fixed(const comm::Membership& m);
  bool finishing(const comm::Membership& m);
  void mark_exited(int rc);
  int finish(int rc, const std::string& verdict, bool close, const std::string& reason = "");
  int64_t current_round();
  std::optional<Stop> round_asked(int64_t round);
  bool replace_worker(int local_rank, const std::string& cause);
  int failures_ = 0;  // restarts used by failures, against --max-restarts
  // What follows a join: the node's line, the store's reply timeout, the membership's wake
  // and the peer check (over the rendezvous, so only once joined).
  void say_joined(const comm::Membership& m, Clock::time_point t0);
  void watch_membership();
  // A spare's parked workers (elastic_worker.h: kParkedVar). A node that finds the membership
  // full without it starts its workers at once, parked: they load, plan and fault in their
  // likely place while this agent's join() waits for a free slot on a thread of its own
  // (join_behind). The parked attempt's monitor (parked_monitor) admits them once the join
  // returns: the membership is posted to them as their first epoch (post_notice), where they
  // enter as newcomers through the same path as any joiner's workers. A parked worker that
  // dies is replaced in its slot (replace_worker). Never admitted (the job ended, closed, or
  // this agent was stopped), the workers are stopped and the agent ends (end_parked).
  bool spare_now();
  void join_behind();
  std::string parked_monitor();
  bool job_ended_without_this_node();
  bool finished_before(const comm::Membership& m);
  [[noreturn]] void end_parked(const Outcome& out);
  bool parked_ = false, admitted_ = false;
  Clock::time_point started_{};
  std::thread joining_;
  std::mutex join_mu_;
  bool join_done_ = false;
  std::optional<comm::Membership> joined_;
  std::string join_error_;
  std::unique_ptr<comm::Store> park_store_;  // the parked monitor's reads, beside the join
  Clock::time_point park_looked_{};
  bool job_ended_ = false;
  int park_wake_fd_ = -1;
  std::string exited_key(const std::string& node) const { return prefix_ + "/exited/" + node; }

  const RunOptions& o_;
  SupervisorOptions so_;
  const std::string me_, token_;
  int port_;             // 0 with --standalone until the store is served (a free port)
  std::string where_;
  const comm::RendezvousOptions ro_;
  const bool elastic_;       // restarts or a node range: membership changes restart
  const bool etcd_;          // the rendezvous lives in etcd; node 0 serves the workers' store
  const bool static_;        // --node-rank fixes this node's place; node rank 0 hosts the store
  const std::string host_;   // the rendezvous store's host (c10d, static)
  const std::string key_;    // "rdzv/<id>/"
  std::unique_ptr<comm::TCPStoreServer> server_;  // c10d: the rendezvous store, if here
  std::unique_ptr<comm::TCPStoreServer> workers_server_;  // etcd: the workers' store, if here
  std::unique_ptr<comm::Store> store_;
  std::unique_ptr<comm::Store> beat_store_;  // the heartbeat's connection, over etcd
  std::unique_ptr<comm::Rendezvous> rdzv_;
  // Wakes the supervisor's monitor when the membership record changes (after join()), over
  // a store connection of its own (membership_wake.h says why).
  std::unique_ptr<comm::Store> wake_store_;
  std::unique_ptr<MembershipWake> wake_;
  // Where the store cannot bind the alive key to the agent's connection (etcd): this node's
  // peer check listener, published before it joins, and its observer of the other nodes
  // over a store connection of its own (comm/elastic/peer_check.h), started after join().
  void listen_for_peers();
  void check_peers();
  std::unique_ptr<comm::PeerListener> peer_listener_;
  std::unique_ptr<comm::Store> check_store_;
  std::unique_ptr<comm::PeerCheck> peer_check_;
  std::string store_node_ = "?";
  std::string prefix_;  // this attempt's store prefix
  std::optional<comm::Membership> last_;  // the membership of the latest attempt
  Stop stop_;           // why the monitor stopped the current attempt
  // elastic.on_change: reshard. Workers that follow epoch notices (epoch_notice.h) keep
  // running across membership changes: the agent posts the new epoch instead of stopping
  // them, and a failed worker takes only its own node out of the job.
  // The agent's own folder (the epoch notice): removed at exit, or by the next weft run on
  // the machine once this one is gone (SIGKILL leaves it no chance: ScratchDir).
  std::optional<ScratchDir> scratch_;
  std::string epoch_file_;  // WEFT_EPOCH_FILE
  int64_t round_ = 0;       // the attempt's restart round (store prefixes)
  comm::Membership current_;  // the membership the running workers are in
  // The worlds this node's workers may still be in (current_ and the epochs posted since;
  // the latest kProcessLossEpochs), for each notice's exact per-epoch loss verdicts.
  std::map<int64_t, comm::Membership> worlds_;
  bool quick_growth_ = false;  // set_grow_last_call done
  // A graceful leave (SIGTERM with live workers): leave the membership, wait for the epoch
  // formed without this node, and post it to the workers with `leave`: they hand their
  // state over in its first world, say so (mark_handed_over), and end once the agent has
  // confirmed it (`released`); a later epoch that still lists this node as departed (it
  // formed before the confirmation, e.g. another node left during the move) is posted to
  // them in turn, and they hand over there.
  bool leaving_ = false, left_ = false, released_ = false;
  int64_t departure_epoch_ = 0;  // the epoch last posted to the departing workers
  EpochNotice departure_notice_;
  Stop depart();
  EpochNotice departure_notice(const comm::Membership& next);
  // A restart round while this node departs: its workers restart in the round's world as
  // departing ones (depart() stops them, run() starts them with these).
  comm::Membership departure_membership();
  EpochNotice departure_start(const comm::Membership& m);
  void hold_confirmation_for_a_round();
  bool held_confirmation_ = false;  // hold_confirmation_for_a_round() done
  bool live() const { return !epoch_file_.empty() && all_following(epoch_file_, so_.nproc); }
  void post_notice(const comm::Membership& next, const Stop& why);
  EpochNotice notice_of(const comm::Membership& next, int node_index);
  void make_scratch();
  void serve_while_others_run();
  // The node's snapshot agent (snapshot.every > 0): started once the node has its index,
  // restarted when it dies, finished when the job ends well here, stopped otherwise.
  std::unique_ptr<SnapshotAgentProcess> snapshots_;
  // snapshot.redundancy: replica. Each node publishes its agent's endpoint for the epoch
  // under rdzv/<id>/snapshot/<epoch>/<node index>; once every node of the epoch has, the
  // agent is told the ring (`peers`), and again whenever an endpoint changes (a restarted
  // agent listens on a new port). Never throws: replicas must not stop training.
  void sync_snapshot_peers();
  std::string snapshot_key(int64_t epoch, int node) const {
    return key_ + "snapshot/" + std::to_string(epoch) + "/" + std::to_string(node);
  }
  struct SnapshotPeers {
    int64_t epoch = -1;
    int node = -1, generation = -1;  // what was published: for this agent start
    std::vector<std::string> sent;   // the ring the agent was told (of `sent_epoch`)
    int64_t sent_epoch = -1;
    int sent_generation = -1;
    Clock::time_point checked{};
    bool failing = false;
  } snap_peers_;
};

// torchrun's rule: on the endpoint's machine the first agent to bind the port hosts the
// store; a taken port means another agent hosts it, so connect like everyone else.
void NodeAgent::serve_store_if_first() {
  // c10d: --rdzv-conf is_host decides when given (torchrun's override of the local check).
  const bool host_here = static_ ? o_.node_rank == 0
                                 : o_.rdzv_conf.is_host.value_or(is_local_host(host_));
  if (etcd_ || !host_here) return;
  comm::TCPStoreServerOptions sso;
  sso.host = bind_host(host_);
  sso.port = uint16_t(port_);
  sso.token = token_;
  sso.insecure = o_.rdzv_conf.insecure.value_or(false) && token_.empty();
  if (o_.rdzv_conf.bound_key_grace) sso.bound_key_grace = millis(*o_.rdzv_conf.bound_key_grace);
  try {
    server_ = std::make_unique<comm::TCPStoreServer>(sso);
    port_ = server_->port();  // the port it got, when asked for a free one (0)
    where_ = where(o_, port_);
    std::fprintf(stderr,
                 "weft run: node %s serves the rendezvous store on %s:%d (bound_key_grace %g "
                 "s)\n",
                 me_.c_str(), sso.host.c_str(), port_, seconds(sso.bound_key_grace));
  } catch (const comm::AddressInUseError& e) {
    // An agent told to host (is_host), or static's node rank 0 (the store's host by
    // definition): anyone else on the port is not this job's store.
    if (o_.rdzv_conf.is_host.value_or(false))
      throw ConfigError("--rdzv-conf is_host", str("this agent must host the store, but ", host_,
                                                   ":", port_, " is taken (", e.what(), ")"));
    if (static_)
      throw ConfigError("--master-port", str("node rank 0 hosts the store, but ", host_, ":",
                                             port_, " is taken (", e.what(),
                                             "); choose a free --master-port"));
  }
}

void NodeAgent::connect_store() { store_ = another_connection(); }

void NodeAgent::listen_for_peers() {
  if (store_->binds_to_connection()) return;  // the store drops a dead node's key itself
  try {
    // The address the other nodes reach this one on (toward the first etcd member), like the
    // workers' store of an etcd job.
    const std::string here = parallel::address_toward(o_.rdzv_host, uint16_t(port_));
    peer_listener_ = std::make_unique<comm::PeerListener>(here, 0, me_, token_);
    store_->set(rdzv_->peer_key(me_), comm::to_bytes(peer_listener_->endpoint()));
  } catch (const std::exception& e) {
    peer_listener_.reset();
    std::fprintf(stderr,
                 "weft run: node %s has no peer check listener (%s): the others see it lost "
                 "by its heartbeat_timeout only\n",
                 me_.c_str(), e.what());
  }
}

void NodeAgent::check_peers() {
  if (store_->binds_to_connection()) return;
  comm::PeerCheckOptions pco;
  pco.token = token_;
  if (o_.rdzv_conf.bound_key_grace) pco.grace = millis(*o_.rdzv_conf.bound_key_grace);
  pco.on_lost = [this](const std::string&, const std::string&) {
    if (wake_) wake_->poke_loss();
  };
  try {
    check_store_ = another_connection();
    check_store_->set_timeout(ro_.heartbeat_timeout);
    peer_check_ = std::make_unique<comm::PeerCheck>(*check_store_, *rdzv_, pco);
    std::fprintf(stderr,
                 "weft run: node %s watches the other nodes through peer connections "
                 "(bound_key_grace %g s; heartbeat_timeout %g s for a host that vanishes)\n",
                 me_.c_str(), seconds(pco.grace), seconds(ro_.heartbeat_timeout));
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "weft run: node %s cannot watch the other nodes through peer connections (%s): "
                 "it sees a lost node by its heartbeat_timeout only\n",
                 me_.c_str(), e.what());
  }
}

std::unique_ptr<comm::Store> NodeAgent::another_connection() {
  if (etcd_) return comm::make_etcd_store(o_.rdzv_endpoints, "/weft/", store_timeout());
  return std::make_unique<comm::TCPStore>(
      comm::TCPStoreOptions{host_, uint16_t(port_), store_timeout(), token_});
}

// Where this attempt's workers bootstrap (WEFT_STORE_ADDR). c10d: the rendezvous store
// itself. etcd: a TCP store served by node 0 of the epoch (etcd is for the agents'
// few keys, not the workers' bootstrap traffic), its address published in etcd under the
// attempt's prefix; a new epoch without that node gets a new one from its new node 0.
void NodeAgent::place_workers_store(const comm::Membership& m) {
  if (!etcd_) {
    so_.store_host = host_;
    so_.store_port = port_;
    return;
  }
  const std::string key = prefix_ + "/workers_store";
  if (m.index == 0) {
    // The address the other nodes reach this one on (toward the first etcd member), and
    // the only one the store listens on.
    const std::string here = parallel::address_toward(o_.rdzv_host, uint16_t(port_));
    if (!workers_server_) {
      comm::TCPStoreServerOptions sso;
      sso.host = here;
      sso.token = token_;
      sso.insecure = o_.rdzv_conf.insecure.value_or(false) && token_.empty();
      workers_server_ = std::make_unique<comm::TCPStoreServer>(sso);
    }
    store_->set(key, comm::to_bytes(here + ":" + std::to_string(workers_server_->port())));
  }
  // Node 0 publishes it once its previous attempt's workers are gone, which may take
  // --grace: wait as long as a rendezvous may, not a store call's heartbeat-long timeout.
  store_->wait({key}, ro_.join_timeout);
  const std::string addr = comm::to_string(store_->get(key));
  const size_t colon = addr.rfind(':');
  so_.store_host = addr.substr(0, colon);
  so_.store_port = std::stoi(addr.substr(colon + 1));
}

// Static: --node-rank R is this node's alone. The claim (rdzv/<id>/static_rank/R = node id)
// goes by compare-and-set; a holder whose heartbeat expired (a replaced machine) gives it up.
void NodeAgent::claim_static_rank() {
  const std::string key = key_ + "static_rank/" + std::to_string(o_.node_rank);
  for (;;) {
    const comm::Bytes held = store_->compare_set(key, {}, comm::to_bytes(me_));
    const std::string holder = comm::to_string(held);
    if (holder == me_) return;
    if (!store_->check({rdzv_->alive_key(holder)})) {
      store_->compare_set(key, held, comm::to_bytes(me_));
      continue;
    }
    throw ConfigError(o_.name("--node-rank"),
                      str("node rank ", o_.node_rank, " is already taken by node ", holder,
                          " (alive); give each node its own --node-rank 0..", o_.nnodes_max - 1));
  }
}

// rdzv.join(), again while this node waits as a spare of a full membership (a spare waits
// for a member to go, however long that takes; join_timeout bounds only a rendezvous that
// lacks nodes).
comm::Membership NodeAgent::join() {
  auto full = [&](const comm::MembershipRecord& r) {
    return !r.closed && r.epoch > 0 && int(r.members.size()) >= ro_.max_nodes &&
           !r.rank_of(me_);
  };
  comm::MembershipRecord r = rdzv_->read_record();
  if (full(r))  // said at once: join() below may wait for a free slot for a long time
    std::fprintf(stderr,
                 "weft run: node %s waits as a spare: the membership of epoch %lld is full at "
                 "%d nodes (--nnodes %d:%d)\n",
                 me_.c_str(), (long long)r.epoch, ro_.max_nodes, ro_.min_nodes, ro_.max_nodes);
  std::fflush(stderr);
  for (;;) {
    try {
      return rdzv_->join();
    } catch (const TimeoutError&) {
      if (!full(rdzv_->read_record())) throw;
    }
  }
}

// Whether this node would wait as a spare: the membership is full without it (join()'s test).
bool NodeAgent::spare_now() {
  const comm::MembershipRecord r = rdzv_->read_record();
  return !r.closed && r.epoch > 0 && int(r.members.size()) >= ro_.max_nodes && !r.rank_of(me_);
}

// join() on a thread of its own (it holds the rendezvous and the agent's store connection
// until this node is admitted; nothing else uses them meanwhile), and an eventfd that the
// supervisor polls (SupervisorOptions::wake_fd) so that an admission is acted on at once.
void NodeAgent::join_behind() {
  park_store_ = another_connection();
  park_store_->set_timeout(ro_.heartbeat_timeout);
  park_wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  so_.wake_fd = park_wake_fd_;
  joining_ = std::thread([this] {
    std::optional<comm::Membership> m;
    std::string error;
    try {
      m = join();
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(join_mu_);
      joined_ = std::move(m);
      join_error_ = std::move(error);
      join_done_ = true;
    }
    const uint64_t one = 1;
    if (park_wake_fd_ >= 0) (void)!::write(park_wake_fd_, &one, sizeof one);
  });
}

// The parked attempt's monitor: nothing (the workers wait) until the join returns; then the
// admission, posted to the workers as their first epoch; from then on the members' monitor.
std::string NodeAgent::parked_monitor() {
  if (snapshots_) snapshots_->keep_alive();
  if (!admitted_) {
    bool done = false;
    std::optional<comm::Membership> m;
    std::string error;
    {
      std::lock_guard<std::mutex> lock(join_mu_);
      done = join_done_;
      m = joined_;
      error = join_error_;
    }
    if (!done)
      return job_ended_without_this_node() ? "the job ended before this spare was admitted" : "";
    joining_.join();
    if (!m) return str("node ", me_, " waited as a spare and cannot join: ", error);
    if (finished_before(*m)) {
      // The epoch formed because a member finished (its heartbeat ended with the job), not
      // because one was lost: nobody trains in it. This node leaves it at once.
      job_ended_ = true;
      try {
        rdzv_->leave();
      } catch (const std::exception&) {
      }
      return "the job ended before this spare was admitted";
    }
    admitted_ = true;
    say_joined(*m, started_);
    watch_membership();
    round_ = m->round;
    current_ = *m;
    stop_ = Stop{};
    const std::string why = str("node ", me_, " admitted from the spares in epoch ", m->epoch, " (",
                                m->world(), " nodes)");
    if (!live()) {
      // Workers that do not follow notices (elastic.on_change: restart; or not that far yet)
      // cannot enter by one: they are stopped and started in the epoch, as before parking.
      stop_ = Stop{why + "; its parked workers are started anew in it", true, false, false, *m};
      return stop_.why;
    }
    post_notice(*m, Stop{why + ": its parked workers enter as newcomers"});
    so_.restart_count = int(m->epoch - 1 + round_);  // a replacement's attempt folder
    sync_snapshot_peers();
    return "";
  }
  sync_snapshot_peers();
  return monitor(current_, round_);
}

// Whether a member of the epoch before `m` finished there (exited 0): a member's heartbeat
// ends only once every other member finished too (finish()'s barrier), so an epoch formed
// then is the job's end mistaken for a loss.
bool NodeAgent::finished_before(const comm::Membership& m) {
  try {
    const std::string prefix =
        str(key_, "epoch/", m.epoch - 1, "/round/", current_round(), "/exited/");
    for (const comm::Member& x : m.members)
      if (x.node_id != me_ && store_->check({prefix + x.node_id}) &&
          comm::to_string(store_->get(prefix + x.node_id)) == "0")
        return true;
  } catch (const std::exception&) {
  }
  return false;
}

// Every member of the latest epoch's attempt finished (exited 0): nobody will ever admit this
// spare. Read beside the join (which holds the rendezvous) on a connection of its own, at
// most once a second.
bool NodeAgent::job_ended_without_this_node() {
  if (job_ended_ || Clock::now() - park_looked_ < std::chrono::seconds(1)) return job_ended_;
  park_looked_ = Clock::now();
  try {
    const std::string state = rdzv_->state_key();
    if (!park_store_->check({state})) return false;
    const comm::MembershipRecord r = comm::decode(comm::to_string(park_store_->get(state)), state);
    if (r.closed || r.epoch == 0) return false;  // a close: the join says why
    const comm::Membership view = rdzv_->view(r);
    if (view.members.empty()) return false;
    const std::string prefix = view.store_prefix + "/round/" + std::to_string(r.round);
    for (const comm::Member& x : view.members) {
      const std::string key = prefix + "/exited/" + x.node_id;
      if (!park_store_->check({key}) || comm::to_string(park_store_->get(key)) != "0") return false;
    }
    job_ended_ = true;
  } catch (const std::exception&) {
  }
  return job_ended_;
}

// A spare that was never admitted: its parked workers are stopped (supervise returned), the
// agent ends. Its join still waits on its thread, holding the rendezvous and the agent's
// store connection for up to join_timeout: the process ends without waiting for it (its
// alive key goes with that connection, or by its TTL; a spare's absence changes nothing for
// the members). Exit 0 when the job ended well without it.
void NodeAgent::end_parked(const Outcome& out) {
  int code = out.end == Outcome::End::kSignalled ? out.code : out.code == 0 ? 1 : out.code;
  if (job_ended_) {
    code = 0;
    std::fprintf(stderr,
                 "weft run: node %s: the job ended before this spare was admitted; its parked "
                 "workers stopped\n",
                 me_.c_str());
  } else {
    const std::string why = !out.verdict.empty() ? out.verdict : out.cause;
    std::fprintf(stderr,
                 "weft run: failed: node %s stopped while waiting as a spare%s%s; its parked "
                 "workers stopped\n",
                 me_.c_str(), why.empty() ? "" : ": ", why.c_str());
  }
  if (snapshots_) snapshots_->stop();
  scratch_.reset();  // the notice's folder
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

// After a failure here: the membership the next attempt runs in. Waits until every member
// of the current epoch is alive again (a lost one is re-formed away by poll_change once its
// heartbeat expired), at most join_timeout (then poll_change throws). The departing nodes
// are the record's now, not those of the epoch's formation: a node that has confirmed its
// hand-over since is gone, and the next attempt's world must not count its workers. They come
// with the round from one read: no confirmation changes them within a round before its world
// formed (Rendezvous::confirm_handover), so every agent's attempt counts the same ones.
comm::Membership NodeAgent::settle() {
  for (;;) {
    if (std::optional<comm::Membership> next = rdzv_->poll_change()) return *next;
    comm::Membership m = *rdzv_->membership();
    bool all = true;
    for (const comm::Member& x : m.members)
      all = all && (x.node_id == me_ || store_->check({rdzv_->alive_key(x.node_id)}));
    if (all) {
      const comm::MembershipRecord r = rdzv_->read_record();
      if (r.epoch != m.epoch) continue;  // a new epoch: poll_change adopts it
      const comm::Membership now = rdzv_->view(r);
      m.departed = now.departed;
      m.round = now.round;
      return m;
    }
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

// The restart round: a read of the record at every monitor pass (Rendezvous::restart_round
// says why: over etcd, a write sent as the leader died ran out its 2 s request timeout while
// the survivors' new epoch waited for this node; issue 14).
int64_t NodeAgent::current_round() { return rdzv_->restart_round(); }

// The restart round moved past `round` (another node asked for it): every node's workers
// restart in the new one (a loss: their world lost a process).
std::optional<Stop> NodeAgent::round_asked(int64_t round) {
  const int64_t now = current_round();
  if (now <= round) return std::nullopt;
  const std::string why_key = key_ + "round_reason/" + std::to_string(now);
  std::string why = store_->check({why_key}) ? comm::to_string(store_->get(why_key)) : "";
  return Stop{"restart round " + std::to_string(now) + " asked for by " +
                  (why.empty() ? "another node" : why),
              true, true, true, std::nullopt};
}

// Elastic: a restart round asked for by another node, or a new membership epoch.
Stop NodeAgent::watch_elastic(const comm::Membership& m, int64_t round) {
  if (leaving_) return depart();
  if (finishing(m)) return {};
  if (std::optional<Stop> asked = round_asked(round)) return *asked;
  const bool live_now = live();
  if (live_now && !quick_growth_) {
    // A newcomer costs live workers a step boundary and a transfer, not a restart: admit it
    // about two heartbeats after it arrived rather than after the last call.
    rdzv_->set_grow_last_call(2 * ro_.heartbeat_interval);
    quick_growth_ = true;
  }
  if (std::optional<comm::Membership> next = rdzv_->poll_change()) {
    Stop change = membership_change(m, *next, so_.nproc);  // m: the workers' epoch (current_)
    if (!live_now) return change;
    // Live workers must all see one world per epoch: an epoch a member has already left is
    // re-formed at the next poll, and that one is posted (against the epoch they are in).
    // The workers reshard at their next step boundary.
    if (next->settled) post_notice(*next, membership_change(current_, *next, so_.nproc));
  }
  return {};
}

// A worker here failed (supervisor.h `replace`): with live workers (elastic.on_change:
// reshard) and restarts left, replace it in place. The membership is renewed (epoch E+1,
// the same nodes, this worker listed as replaced), the notice tells every node's workers that
// a process of their world is gone (`lost`: their collectives abort at once), and the
// supervisor starts the replacement in E+1, where it joins as a newcomer and receives its
// state through the router. Nobody else restarts: the node's other workers and every other
// node's keep their processes. Each replacement uses one of --max-restarts, like a restart
// in torchrun. False (the attempt then fails the usual way, below in run()): not live, a
// graceful leave or the job's end under way, a signal, or no restarts left; then, in a job
// that can shrink (--nnodes MIN:MAX above MIN) the node leaves and the others go on,
// otherwise (--standalone, a fixed --nnodes, at MIN) the job fails naming the worker and
// --max-restarts. Never throws.
bool NodeAgent::replace_worker(int local_rank, const std::string& cause) {
  if (parked_ && !admitted_) {
    // A parked worker is in no world: a new one takes its slot, parked in turn, and nobody
    // else hears of it. It uses one of --max-restarts all the same (a worker that cannot
    // start, a bad config, must not restart forever).
    if (stop_requested()) return false;
    if (failures_ >= o_.max_restarts) {
      std::fprintf(stderr, "weft run: %s; no restarts left to replace it (--max-restarts %d)\n",
                   cause.c_str(), o_.max_restarts);
      std::fflush(stderr);
      return false;
    }
    ++failures_;
    std::fprintf(stderr,
                 "weft run: %s; a spare's parked worker: replaced in its slot, parked (%d of "
                 "--max-restarts %d used)\n",
                 cause.c_str(), failures_, o_.max_restarts);
    std::fflush(stderr);
    return true;
  }
  if (!elastic_ || !live() || leaving_ || stop_requested()) return false;
  if (failures_ >= o_.max_restarts) {
    std::fprintf(stderr, "weft run: %s; no restarts left to replace it (--max-restarts %d)\n",
                 cause.c_str(), o_.max_restarts);
    std::fflush(stderr);
    return false;
  }
  try {
    if (finishing(current_)) return false;
    // Tests only (WEFT_TEST_REFUSE_RENEWAL=1): the store refuses the renewal, so that a failed
    // worker at MIN nodes makes a restart round (tests/parallel/live_resize_leave_round_test.cc).
    if (env_int("WEFT_TEST_REFUSE_RENEWAL", 0) == 1)
      throw CommError("the store refused the renewal (WEFT_TEST_REFUSE_RENEWAL)");
    std::optional<comm::Membership> next;
    // A change already under way (a node left or was lost, and renew() refuses to hide it)
    // is formed and posted first; then its epoch is renewed. Bounded: a few polls.
    for (int tries = 0; tries < 100 && !next; ++tries) {
      next = rdzv_->renew({local_rank});
      if (next) break;
      if (std::optional<comm::Membership> other = rdzv_->poll_change())
        if (other->settled) post_notice(*other, membership_change(current_, *other, so_.nproc));
      std::this_thread::sleep_for(ro_.poll_interval);
    }
    if (!next) return false;
    ++failures_;
    Stop why = membership_change(current_, *next, so_.nproc);
    why.why = str(cause, "; replaced in place (", failures_, " of --max-restarts ",
                  o_.max_restarts, " used), the other workers keep running: ", why.why);
    post_notice(*next, why);
    so_.restart_count = int(next->epoch - 1 + round_);  // the replacement's attempt folder
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft run: cannot replace rank %d in place (%s); the attempt fails\n",
                 so_.node_index * so_.nproc + local_rank, e.what());
    std::fflush(stderr);
    return false;
  }
}

// The workers of this node go on in `next`: the attempt's settings follow the membership,
// and the notice tells the workers where the new epoch bootstraps.
// The notice of `next` for this node's workers at `node_index` of its first world (the
// members, then the departing nodes), with the epoch's workers' store (placed here).
EpochNotice NodeAgent::notice_of(const comm::Membership& next, int node_index) {
  place_workers_store(next);
  EpochNotice n;
  n.epoch = next.epoch;
  n.node_index = node_index;
  n.nnodes = next.world();
  n.nproc = so_.nproc;
  n.store_host = so_.store_host;
  n.store_port = so_.store_port;
  n.store_prefix = prefix_;
  n.transit_nodes = next.world() + int(next.departed.size());
  n.restart_count = int(next.epoch - 1 + round_);
  return n;
}

void NodeAgent::post_notice(const comm::Membership& next, const Stop& why) {
  const comm::Membership was = current_;
  prefix_ = next.store_prefix + "/round/" + std::to_string(round_);
  last_ = next;
  current_ = next;
  so_.node_index = static_ ? o_.node_rank : next.index;
  so_.nnodes = next.world();
  so_.store_prefix = prefix_;
  so_.rdzv_epoch = next.epoch;
  EpochNotice n = notice_of(next, so_.node_index);
  // Lost: a process of the workers' world is gone (a member lost, or a worker replaced in
  // place, in any epoch since theirs: several may have formed since this agent's last poll),
  // so collectives waiting on it abort at once.
  n.lost = comm::lost_a_process(was, next);
  for (const auto& [epoch, id] : next.process_losses) n.lost_at = std::max(n.lost_at, epoch);
  worlds_[was.epoch] = was;
  n.lost_since = comm::losses_since(worlds_, next);
  worlds_[next.epoch] = next;
  while (!worlds_.empty() && worlds_.begin()->first <= next.epoch - comm::kProcessLossEpochs)
    worlds_.erase(worlds_.begin());
  n.why = why.why;
  write_epoch_notice(epoch_file_, n);
  std::fprintf(stderr, "weft run: %s; node %s is node %d of %d, its workers reshard live\n",
               why.why.c_str(), me_.c_str(), n.node_index, n.nnodes);
  std::fflush(stderr);
}

// The graceful leave, one monitor pass at a time: leave the membership (the others re-form
// without this node at their next poll, with it among the epoch's `departed`), then post
// that epoch to this node's workers as departing nodes of its transition world; once they
// all handed over there, confirm it and release them, or post the later epoch that formed
// before the confirmation and still lists this node. A restart round asked for meanwhile
// (a worker failed elsewhere and its node could not renew the epoch) restarts every node's
// workers in the same epoch, and its world counts this node's as departing ones: they are
// stopped like everyone's and started in it to hand over there (run()). Workers that handed
// over in the round before handed over to a world the new one replaces: the confirmation,
// made against the attempt's round, is refused once a later one was asked (the round and
// the departed are one record, Rendezvous::confirm_handover), so no agent may count this
// node's workers in the round's world while they end.
Stop NodeAgent::depart() {
  if (!left_) {
    std::fprintf(stderr,
                 "weft run: node %s leaves the job gracefully: its workers finish their step and "
                 "hand their state over first\n",
                 me_.c_str());
    std::fflush(stderr);
    rdzv_->leave(/*hands_over=*/true);
    left_ = true;
  }
  if (released_) return {};
  if (departure_epoch_ > 0 && all_handed_over(epoch_file_, so_.nproc, departure_epoch_)) {
    hold_confirmation_for_a_round();
    if (rdzv_->confirm_handover(departure_epoch_, round_) ==
        comm::Rendezvous::HandOver::kReleased) {
      departure_notice_.released = true;
      write_epoch_notice(epoch_file_, departure_notice_);
      released_ = true;
      return {};
    }
  }
  if (std::optional<Stop> asked = round_asked(round_)) {
    asked->why += str("; node ", me_, " is leaving: its workers restart in it to hand over");
    return *asked;
  }
  const comm::MembershipRecord r = rdzv_->read_record();
  if (r.closed) return Stop{"the job was stopped by another node: " + r.close_reason};
  if (r.epoch <= std::max(current_.epoch, departure_epoch_)) return {};
  if (!r.departed.count(me_))
    return Stop{str("epoch ", r.epoch, " formed without this node among the departed (its "
                    "heartbeat was lost): its workers cannot hand their state over")};
  const comm::Membership next = rdzv_->view(r);
  EpochNotice n = departure_notice(next);
  n.why = departure_epoch_ == 0
              ? str("node ", me_, " leaves the job gracefully (epoch ", current_.epoch, " -> ",
                    next.epoch, ", ", current_.world(), " -> ", next.world(), " nodes)")
              : str("node ", me_, " hands its state over in epoch ", next.epoch, " (epoch ",
                    departure_epoch_, " was replaced before its hand-over was confirmed)");
  write_epoch_notice(epoch_file_, n);
  departure_epoch_ = next.epoch;
  departure_notice_ = n;
  return {};
}

// Tests only (WEFT_TEST_CONFIRM_AFTER_ROUND=<ms>): the first confirmation of a hand-over waits
// until a restart round later than the attempt's was asked, then <ms> more, so that it lands
// after the round's asker read the record and before the others may have: the window between
// a round and a confirmation held open (tests/parallel/live_resize_leave_round_test.cc).
// Bounded by join_timeout.
void NodeAgent::hold_confirmation_for_a_round() {
  const int64_t ms = env_int("WEFT_TEST_CONFIRM_AFTER_ROUND", -1);
  if (ms < 0 || held_confirmation_) return;
  held_confirmation_ = true;
  std::fprintf(stderr,
               "weft run: node %s holds its hand-over confirmation until a restart round is "
               "asked (WEFT_TEST_CONFIRM_AFTER_ROUND)\n",
               me_.c_str());
  std::fflush(stderr);
  const auto until = Clock::now() + ro_.join_timeout;
  while (current_round() <= round_ && Clock::now() < until)
    std::this_thread::sleep_for(ro_.poll_interval);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// The notice of `next` (an epoch that lists this node as departed) for its departing workers:
// their place follows the members', in the departed nodes' order; the attempt's round.
EpochNotice NodeAgent::departure_notice(const comm::Membership& next) {
  int slot = 0;
  for (size_t i = 0; i < next.departed.size(); ++i)
    if (next.departed[i].node_id == me_) slot = int(i);
  prefix_ = next.store_prefix + "/round/" + std::to_string(round_);
  EpochNotice n = notice_of(next, next.world() + slot);
  n.leave = true;
  return n;
}

// The epoch a departing node's workers restart in for a restart round: the record's latest,
// which still lists this node as departed (settle() is a member's; this node left).
comm::Membership NodeAgent::departure_membership() {
  const comm::MembershipRecord r = rdzv_->read_record();
  if (r.closed)
    throw comm::RendezvousClosedError("the job was stopped by another node: " + r.close_reason);
  if (!r.departed.count(me_))
    throw comm::QuorumLostError(str("epoch ", r.epoch, " no longer lists node ", me_,
                                    " as departed (its heartbeat was lost): its workers cannot "
                                    "hand their state over"));
  return rdzv_->view(r);
}

// The departing workers' start in `m` (a restart round's attempt): their environment places
// them in the transition world, beyond the members (its size, so that their ranks fit), and
// their first notice says they leave. What the stopped workers said of their hand-over goes:
// the new ones hand over in the round's world.
EpochNotice NodeAgent::departure_start(const comm::Membership& m) {
  EpochNotice n = departure_notice(m);
  n.why =
      str("node ", me_, " hands its state over in epoch ", m.epoch, "'s restart round ", round_);
  so_.node_index = n.node_index;
  so_.nnodes = n.transit_nodes;
  clear_handed_over(epoch_file_, so_.nproc);
  departure_epoch_ = m.epoch;
  departure_notice_ = n;
  return n;
}

void NodeAgent::sync_snapshot_peers() {
  // A departing node is in no ring of the epochs after its leave (its agent keeps the one
  // it had): its workers' place there is beyond the members (departure_start).
  if (!snapshots_ || snapshots_->plan().listen.empty() || !store_ || left_) return;
  SnapshotPeers& p = snap_peers_;
  const int64_t epoch = so_.rdzv_epoch;
  const int node = so_.node_index, n = so_.nnodes;
  const int generation = snapshots_->generation();
  try {
    if (p.epoch != epoch || p.node != node || p.generation != generation) {
      const std::string here = snapshots_->endpoint();
      if (here.empty()) return;  // not answering yet: the next tick asks again
      store_->set(snapshot_key(epoch, node), comm::to_bytes(here));
      p.epoch = epoch;
      p.node = node;
      p.generation = generation;
      p.checked = {};
    }
    // Told already: look again about once a second (another node's agent may have restarted).
    const bool told = p.sent_epoch == epoch && p.sent_generation == generation;
    if (told && Clock::now() - p.checked < std::chrono::seconds(1)) return;
    p.checked = Clock::now();
    std::vector<std::string> keys;
    for (int i = 0; i < n; ++i) keys.push_back(snapshot_key(epoch, i));
    if (!store_->check(keys)) return;  // not every node has published yet
    std::vector<std::string> nodes;
    for (const comm::Bytes& b : store_->multi_get(keys)) nodes.push_back(comm::to_string(b));
    if (told && nodes == p.sent) return;
    snapshots_->peers(epoch, node, nodes);
    const int ec_k = snapshots_->plan().ec_k, ec_m = snapshots_->plan().ec_m;
    const bool ec = snapshots_->plan().redundancy == "ec";
    if (ec && n >= ec_k + ec_m)
      std::fprintf(stderr,
                   "weft run: epoch %lld: this node's snapshots are erasure-coded over the "
                   "epoch's %d nodes (k=%d, m=%d; the agent's log says the groups)\n",
                   (long long)epoch, n, ec_k, ec_m);
    else if (ec && checkpoint::StripeLayout::codes(n, ec_m))  // as its agent says
      std::fprintf(stderr,
                   "weft run: epoch %lld: the epoch's %d nodes are fewer than k + m = %d: this "
                   "node's snapshots are erasure-coded over one group of all %d with K = %d data "
                   "+ %d parity fragment(s) per stripe, each node holding parity of %d/%d of its "
                   "own snapshot bytes where its memory has room (its agent's reserve says)\n",
                   (long long)epoch, n, ec_k + ec_m, n, n - ec_m, ec_m, ec_m, n - ec_m);
    else if (ec)  // as its agent says (snapshot_parity_ring.cc)
      std::fprintf(stderr,
                   "weft run: epoch %lld: the epoch's %d node(s) are fewer than m + 1 = %d: this "
                   "node's snapshots are not erasure-coded until enough nodes are members\n",
                   (long long)epoch, n, ec_m + 1);
    else if (n > 1)
      std::fprintf(stderr,
                   "weft run: epoch %lld: this node's snapshots are replicated to node %d (%s)\n",
                   (long long)epoch, (node + 1) % n, nodes[size_t((node + 1) % n)].c_str());
    else
      std::fprintf(stderr,
                   "weft run: epoch %lld: this node is the only one; its snapshots are not "
                   "replicated until another joins\n",
                   (long long)epoch);
    p.sent = std::move(nodes);
    p.sent_epoch = epoch;
    p.sent_generation = generation;
    p.failing = false;
  } catch (const std::exception& e) {
    if (!p.failing)
      std::fprintf(stderr, "weft run: cannot tell the snapshot agent its peers yet: %s\n",
                   e.what());
    p.failing = true;
  }
}

// A node that leaves a live job while it hosts the rendezvous store keeps serving it (the
// others go on and need it) until every other member of the epoch has ended or gone.
void NodeAgent::serve_while_others_run() {
  if (!server_) return;
  const bool leaving = leaving_;  // its SIGTERM asked to leave, not to stop serving
  std::fprintf(stderr, "weft run: node %s keeps serving the rendezvous store until the job ends\n",
               me_.c_str());
  std::fflush(stderr);
  for (;;) {
    bool any = false;
    try {
      comm::MembershipRecord r = rdzv_->read_record();
      if (r.closed) return;
      for (const auto& [id, slot] : r.members) any = any || store_->check({rdzv_->alive_key(id)});
    } catch (const std::exception&) {
      return;
    }
    if (!any || (stop_requested() && !leaving)) return;
    std::this_thread::sleep_for(ro_.poll_interval);
  }
}

void NodeAgent::make_scratch() {
  scratch_.emplace();
  epoch_file_ = scratch_->path() + "/epoch";
  so_.epoch_file = epoch_file_;
}

NodeAgent::~NodeAgent() {
  if (joining_.joinable()) joining_.join();
  if (park_wake_fd_ >= 0) ::close(park_wake_fd_);
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
                          "): ", rdzv_->lost_cause(x.node_id));
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
  if (snapshots_ && rc == 0) snapshots_->finish();
  else if (snapshots_) snapshots_->stop();  // a failed job keeps its snapshots for a restart
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
  // The store's host waits for the spares still waiting too: a parked spare sees the job's
  // end (or its close) within a second and goes; the store gone first would be a lost store
  // to it, a failure.
  if (server_ && rdzv_) try {
      const comm::MembershipRecord r = rdzv_->read_record();
      for (const std::string& id : r.spares)
        while (id != me_ && Clock::now() < until && store_->check({rdzv_->alive_key(id)}))
          std::this_thread::sleep_for(ro_.poll_interval);
    } catch (const std::exception&) {
    }
  rdzv_->heartbeat().stop_and_erase();
  return rc;
}

void NodeAgent::say_joined(const comm::Membership& m, Clock::time_point t0) {
  const std::string host_key = key_ + "store_node";
  if (store_->check({host_key})) store_node_ = comm::to_string(store_->get(host_key));
  // A member waits for a store reply no longer than its lease: a node the store cannot
  // answer for heartbeat_timeout is lost to the others by then, so it must stop too, not
  // wait join_timeout per call (default 600 s) while they go on without it (monitor()).
  store_->set_timeout(ro_.heartbeat_timeout);
  std::fprintf(stderr,
               "weft run: node %s is node %d of %d (rendezvous %s at %s, epoch %lld) after "
               "%.2f s\n",
               me_.c_str(), static_ ? o_.node_rank : m.index, m.world(), run_id(o_).c_str(),
               where_.c_str(), (long long)m.epoch,
               std::chrono::duration<double>(Clock::now() - t0).count());
  std::fflush(stderr);
}

void NodeAgent::watch_membership() {
  // Two polls: the pause after a store call of the wake's that failed.
  try {
    wake_store_ = another_connection();
    wake_store_->set_timeout(ro_.heartbeat_timeout);
    wake_ = std::make_unique<MembershipWake>(*wake_store_, *rdzv_, 2 * ro_.poll_interval);
    so_.wake_fd = wake_->fd();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft run: %s; the agent looks at the membership every %g s only\n",
                 e.what(), o_.monitor_interval);
  }
  check_peers();
}

int NodeAgent::run() {
  serve_store_if_first();
  const auto t0 = Clock::now();
  started_ = t0;
  connect_store();
  const std::string host_key = key_ + "store_node";
  if (server_) store_->set(host_key, comm::to_bytes(me_));
  // Over etcd the heartbeat beats on a connection of its own (Rendezvous's constructor says
  // why); where the store binds the alive key, on the agent's.
  if (!store_->binds_to_connection()) {
    beat_store_ = another_connection();
    beat_store_->set_timeout(ro_.heartbeat_timeout);
  }
  rdzv_ = std::make_unique<comm::Rendezvous>(*store_, ro_, beat_store_.get());
  if (static_) claim_static_rank();  // before joining: a node with a taken rank never joins
  listen_for_peers();
  // A spare of a job whose workers may reshard live parks its workers while it waits.
  parked_ = elastic_ && spare_now();
  comm::Membership m;
  if (parked_) {
    join_behind();
  } else {
    m = join();
    say_joined(m, t0);
  }

  if (!token_.empty()) ::setenv("WEFT_JOB_TOKEN", token_.c_str(), 1);
  try {
    SnapshotAgentSite site;
    // The address the other nodes reach this one on: toward the store (or etcd's first
    // member), like the workers' store of an etcd job.
    site.host = parallel::address_toward(etcd_ ? o_.rdzv_host : host_, uint16_t(port_));
    site.nnodes_max = o_.nnodes_max;
    site.insecure = o_.rdzv_conf.insecure.value_or(false) && token_.empty();
    // A spare's agent starts beside its parked workers (they connect to it as they start),
    // named beyond the membership; any agent under a name no other agent here holds, chosen
    // by taking its lock (SnapshotAgentPlan::node says why).
    const int place = static_ ? o_.node_rank : parked_ ? o_.nnodes_max : m.index;
    snapshots_ = start_snapshot_agent(so_.command, so_.run_id, place, site);
  } catch (const ConfigError& e) {
    if (parked_) end_parked(Outcome{Outcome::End::kFailed, 2, e.what(), e.what()});
    return finish(2, e.what(), true);
  } catch (const std::exception& e) {
    if (parked_) end_parked(Outcome{Outcome::End::kFailed, 1, e.what(), e.what()});
    return finish(1, e.what(), true);
  }
  so_.monitor_interval_s = o_.monitor_interval;
  if (!parked_) watch_membership();
  so_.settle_s = seconds(ro_.heartbeat_timeout) + 2 * seconds(ro_.poll_interval) + 1;
  so_.max_restarts = o_.max_restarts;
  so_.nnodes_min = o_.nnodes_min;
  so_.nnodes_max = o_.nnodes_max;
  if (elastic_) make_scratch();  // a job that may change size can reshard live
  so_.replace = [this](int local, const std::string& cause) {
    return replace_worker(local, cause);
  };
  so_.on_terminate = [this] {
    // Otherwise stop the workers (the job ends): not live, or a job that cannot shrink
    // (--standalone, at MIN nodes), whose others could never form an epoch without it.
    if (parked_ && !admitted_) return false;  // a spare's parked workers just stop
    if (leaving_) return true;  // a departure's restart round: the SIGTERM that asked for it
    if (!elastic_ || !live() || current_.world() <= o_.nnodes_min) return false;
    leaving_ = true;
    return true;
  };
  for (bool first = true;; first = false) {
    Outcome out;
    if (first && parked_) {
      // The lost node's place in a full membership, its epoch unknown (0) until admitted;
      // the workers' environment says so (kParkedVar) and the agent's own goes back after.
      so_.node_index = o_.nnodes_max - 1;
      so_.nnodes = o_.nnodes_max;
      so_.rdzv_epoch = 0;
      so_.restart_count = 0;
      so_.store_prefix.clear();
      // The rendezvous endpoint's address, a well-formed one that they do not connect to:
      // the epoch's workers' store comes with their first notice.
      so_.store_host = host_;
      so_.store_port = port_;
      so_.monitor = [this] { return parked_monitor(); };
      so_.verdict_is_loss = [this] { return admitted_ && stop_.restart && stop_.failure; };
      ::setenv(kParkedVar, "1", 1);
      out = supervise(so_);
      ::unsetenv(kParkedVar);
      if (!admitted_) end_parked(out);
      m = current_;
    } else {
      // The round read with the membership's departing nodes (Membership::round), not a
      // later read: the attempt's world counts those of its own round.
      const int64_t round = m.round;
      round_ = round;
      current_ = m;
      prefix_ = m.store_prefix + "/round/" + std::to_string(round);
      last_ = m;
      // Static: the node's place is --node-rank (claimed once, claim_static_rank); else the
      // membership's dense order.
      so_.node_index = static_ ? o_.node_rank : m.index;
      so_.nnodes = m.world();
      so_.store_prefix = prefix_;
      so_.rdzv_epoch = m.epoch;
      so_.restart_count = int(m.epoch - 1 + round);
      try {
        // Workers started in an epoch learn its first world from a notice, as those that
        // follow into it do: it also holds the nodes still handing over (a newcomer given a
        // departing node's rank), whose workers the epoch's world waits for.
        // (A departing node's attempt is a restart round's: departure_start.)
        const EpochNotice start =
            left_ ? departure_start(m) : notice_of(m, so_.node_index);  // places the workers' store
        if (!epoch_file_.empty()) write_epoch_notice(epoch_file_, start);
      } catch (const std::exception& e) {
        return finish(1,
                      str("cannot place the workers' store of epoch ", m.epoch,
                          " or post its notice: ", e.what()),
                      true);
      }
      stop_ = Stop{};
      if (snapshots_) snapshots_->keep_alive();
      sync_snapshot_peers();
      so_.monitor = [this] {
        if (snapshots_) snapshots_->keep_alive();
        sync_snapshot_peers();
        return monitor(current_, round_);
      };
      // A restart for a failure (a node lost, a worker failed elsewhere): the workers' world is
      // broken, their step cannot end. A join's restart lets them end it and save.
      so_.verdict_is_loss = [this] { return stop_.restart && stop_.failure; };
      out = supervise(so_);
    }
    m = current_;  // the epoch the workers ended in (later than the attempt's when live)

    if (leaving_ && out.end == Outcome::End::kSucceeded) {
      std::fprintf(stderr, "weft run: node %s left the job; its workers handed their state over\n",
                   me_.c_str());
      if (snapshots_) snapshots_->leave();  // the others hold its state: its snapshots go
      serve_while_others_run();
      return 0;
    }
    Stop next;
    switch (out.end) {
      case Outcome::End::kSucceeded:
        return finish(0, "", false);
      case Outcome::End::kSignalled:
        return finish(out.code, out.verdict, true,
                      out.verdict.empty() ? str("stopped by a signal (exit code ", out.code, ")")
                                          : out.verdict);
      case Outcome::End::kStopped:
        next = stop_;
        if (!next.restart) return finish(out.code, out.verdict, next.close);
        break;
      case Outcome::End::kFailed:
        if (!elastic_) break;
        // A node whose workers' snapshots exist only here (snapshot.redundancy: none) does
        // not leave either: without it nobody could restore its ranks' state, and the job
        // would go back to a checkpoint. A restart round restores every rank from the
        // snapshots of every node instead.
        if (live() && current_.world() > o_.nnodes_min &&
            !(snapshots_ && snapshots_->plan().redundancy == "none")) {
          // Workers that follow notices: the other nodes reshard without this one, which
          // leaves at once (no wait for its heartbeat to expire) and, with restarts left,
          // joins again as a newcomer whose workers receive their state from the others.
          // Not when the job cannot shrink (at MIN nodes: the others could not form an
          // epoch without it, and it could not rejoin a full one): a restart round, below.
          try {
            rdzv_->leave();
          } catch (const std::exception&) {
          }
          if (failures_ >= o_.max_restarts) {
            serve_while_others_run();
            return finish(out.code,
                          out.verdict + str("; node ", me_, " leaves the job (no restarts left: "
                                            "--max-restarts ", o_.max_restarts,
                                            "); the other nodes go on without it"),
                          false);
          }
          ++failures_;
          std::fprintf(stderr,
                       "weft run: %s; node %s left the job and joins again with new workers (%d "
                       "of --max-restarts %d used)\n",
                       out.cause.c_str(), me_.c_str(), failures_, o_.max_restarts);
          mark_exited(-1);
          try {
            m = join();
          } catch (const std::exception& e) {
            return finish(1, e.what(), false);
          }
          continue;
        }
        if (failures_ >= o_.max_restarts) {  // say so, here and in the others' reason
          const std::string left = str("; no restarts left (--max-restarts ", o_.max_restarts, ")");
          return finish(out.code, out.verdict + left, true, out.cause + left);
        }
        next.why = str("node ", me_, ": ", out.cause);
        next.restart = next.failure = true;
        // Ask every node for the next round (once: a node that lost the race to ask restarts
        // in the round another node asked for). The reason first: whoever sees the round
        // reads it.
        try {
          store_->set(key_ + "round_reason/" + std::to_string(round_ + 1),
                      comm::to_bytes(next.why));
          rdzv_->ask_round(round_);
        } catch (const std::exception& e) {
          return finish(out.code, out.verdict + "; and could not ask for a restart: " + e.what(), false);
        }
        break;
    }
    if (!next.restart) return finish(out.code, out.verdict, true, out.cause);
    // A node that departs restarts its workers in another node's restart round only to hand
    // their state over, which the round's world waits for (depart()): that uses none of its
    // --max-restarts, and its SIGTERM asked for the leave, not for a stop.
    const bool own = !(left_ && out.end == Outcome::End::kStopped);
    if (own && next.failure && failures_ >= o_.max_restarts)
      return finish(1, next.why + str("; no restarts left (--max-restarts ", o_.max_restarts, ")"),
                    true);
    if (own && next.failure) ++failures_;
    if (stop_requested() && !left_)
      return finish(130, "stopped by a signal between attempts", true);
    if (left_)
      std::fprintf(stderr, "weft run: %s; restarting the workers as departing ones\n",
                   next.why.c_str());
    else
      std::fprintf(stderr, "weft run: %s; restarting the workers (%d of --max-restarts %d used)\n",
                   next.why.c_str(), failures_, o_.max_restarts);
    mark_exited(-1);  // this attempt is over here; not "finished"
    try {
      m = next.next ? *next.next : left_ ? departure_membership() : settle();
    } catch (const comm::QuorumLostError& e) {
      return finish(1, e.what(), false);
    } catch (const std::exception& e) {
      return finish(1, e.what(), true);
    }
    if (!left_)
      std::fprintf(stderr, "weft run: node %s is node %d of %d (epoch %lld)\n", me_.c_str(),
                   m.index, m.world(), (long long)m.epoch);
  }
}

}  // namespace

int run_node_agent(const RunOptions& o, SupervisorOptions so) {
  check_rendezvous_options(o);
  return NodeAgent(o, std::move(so)).run();
}

}  // namespace weft::launch
