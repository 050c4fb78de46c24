// EtcdStore: the Store contract over an etcd v3 cluster (torchrun's `--rdzv-backend etcd`):
// the rendezvous outlives any one machine, since etcd keeps serving while a majority of its
// members is up. Talks HTTP/1.1 + JSON to each member's gRPC gateway (etcd_http.h).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/store/etcd_watch.h"
#include "comm/store/store.h"

namespace weft::comm {

class EtcdHttp;

struct EtcdStoreOptions {
  // The members' client URLs, "host:port" or "http://host:port" (parse_etcd_endpoints).
  // The store talks to one at a time, starting with the first, and moves to the next when
  // it cannot be reached or has no leader.
  std::vector<std::string> endpoints;
  // Every key lives under it in etcd ("/weft/" + "rdzv/job/state"), so that jobs sharing a
  // cluster do not meet and num_keys() counts only this store's keys. Only EtcdStores
  // should write under it (see set()'s lease bookkeeping).
  std::string prefix = "/weft/";
  // get()/multi_get() wait this long for their keys (Store::timeout()).
  Millis timeout = kDefaultStoreTimeout;
  // One exchange with one member (connect, send, reply) gives up after this long and the
  // call moves on to the next member. Far above a healthy etcd's milliseconds; short, so
  // that a member that answers nothing is left soon (a write stuck on a follower whose
  // leader just died is given up sooner, once the follower names a new leader: etcd_http.h).
  Millis request_timeout{2'000};
  // A call that finds no working member gives up (CommError) once every member has failed
  // and this long has passed since it began. Longer than a leader election (about 1 s with
  // etcd's defaults) plus one request_timeout.
  Millis failover_timeout{5'000};
};

// Thread-safe (see Store): one keep-alive connection per store, used by one call at a time
// (a mutex); blocking calls wait between round trips with the mutex released, so a get()
// that waits does not hold up other threads. Several processes each use their own store.
// Destroy it only when no call is in flight.
//
// How each part of the Store contract is kept:
// - Blocking reads (get, multi_get, wait) read the keys, and while any is missing park on an
//   etcd watch of them (etcd_watch.h) from etcd's current revision, then read once more, so
//   that a key set between the first read and the watch is seen by the second (a watch
//   from the first read's revision + 1 would do as much, but etcd delivers the events of a
//   watch that starts at a revision it has passed only at its next 100 ms catch-up, and a
//   key set just then is the one that matters); each event on a waited key
//   (and kRecheck, 1 s, without one) reads again. The watch is a stream on a connection of
//   its own, opened per blocking call on the member the reads go to and closed when the call
//   returns, is stopped (wait_stoppable) or times out (TimeoutError naming the keys); when the
//   reads fail over (the member died or lost its leader, which also ends the watch: it asks for a
//   leader) the next watch goes to the new member. A member that cannot watch (no /v3/watch) makes
//   the store poll instead: a read every 2 ms at first, backing off to every 50 ms.
// - wait_gone() is the same loop the other way round: a read returns the keys already
//   absent at once; otherwise the call parks on a watch of the keys' DELETE events only
//   (etcd's NOPUT filter: a heartbeat's set of a waited key wakes nothing) from the current
//   revision and reads again, so a removal between the read and the watch is seen all the
//   same. An erase and a lease's end (a TTL key expiring, see set()) are both DELETE
//   events. Each event on a waited key reads again (a key set again since is not gone), as
//   does kRecheck; a timeout throws TimeoutError naming the keys; failover and the poll
//   fallback as above.
// - set() with a ttl grants a new etcd lease of ceil(ttl) whole seconds (at least 1; etcd
//   raises it further to its minimum, 1.5 x --election-timeout rounded up, 2 s with etcd's
//   defaults) and puts the key under it. The key's previous lease, if any, is then
//   revoked, so one heartbeat's leases do not pile up: each lease this store grants holds
//   exactly one key, and the put moved that key off the old one, so revoking it deletes
//   nothing. set() without ttl puts with no lease (permanent) and revokes the old lease too.
//   The leader deletes a key when its lease expires, checking every 500 ms, so a TTL key
//   disappears between ttl and about ttl rounded up + 0.5 s after the set (and later if a
//   leader change intervenes: etcd extends every lease by an election timeout then).
// - add, append and compare_set are read-modify-write txns (compare mod_revision, or
//   create_revision == 0 for an absent key) retried until they land; they keep the key's
//   lease (ignore_lease), so they keep its expiry as the contract says.
// - Keys bound to the connection (SetOptions::bind) are not offered: binds_to_connection()
//   is false and such a set() throws NotSupported. An etcd lease ends only by its TTL (or
//   an explicit revoke): etcd does not tie it to a client's connection, and a keep-alive
//   stream that breaks leaves the lease to run out, so a SIGKILLed holder's keys stay
//   until their TTL as after a power loss. The agents' liveness keys over etcd are TTL keys
//   only (comm/elastic/heartbeat.h); the agents' peer check (comm/elastic/peer_check.h)
//   erases a dead node's key within bound_key_grace, and the TTL (heartbeat_timeout after
//   the last beat, plus etcd's expiry check above) stays for a host that vanishes.
// - multi_set is one txn (atomic), so it is limited to etcd's --max-txn-ops (128 by
//   default) distinct keys: beyond that etcd refuses it (CommError).
// - Values: etcd refuses requests over its --max-request-bytes (1.5 MiB by default; values
//   travel base64, so about 1.1 MiB of value): CommError with etcd's message.
// - Errors: CommError naming the member and etcd's message when etcd refuses a request, or
//   naming every member's error when none answers (EtcdHttp::post). When a member dies
//   while handling an add, append or erase, the outcome is unknown and the call throws
//   CommError instead of risking a double add; every other call is simply sent again to
//   the next member.
class EtcdStore : public Store {
 public:
  // Validates the options (ConfigError naming "--rdzv-endpoint" for a bad or missing
  // endpoint); does not contact etcd (the first call does; see ping()).
  explicit EtcdStore(EtcdStoreOptions options);
  // Closes the connection; keys and leases stay in etcd (TTL keys expire). Never throws.
  ~EtcdStore() override;
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  void set(const std::string& key, const Bytes& value, std::optional<Millis> ttl = {}) override;
  // SetOptions::bind: NotSupported (binds_to_connection() is false; see above).
  using Store::set;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  // Through a watch of DELETE events (see the class comment); true.
  std::vector<std::string> wait_gone(const std::vector<std::string>& keys, Millis timeout) override;
  bool waits_for_absence() const override;
  // A stop ends the parked wait at once: its watch's read, or the watch's creation (the
  // caller's thread runs them; the stop posts their cancellation to it). A read of the keys
  // already sent is finished first (a request_timeout at most, failover aside), and a poll's
  // pause (where no watch can be made: at most 50 ms).
  bool wait_stoppable(const std::vector<std::string>& keys, Millis timeout,
                      std::stop_token stop) override;
  std::optional<std::vector<std::string>> wait_gone_stoppable(const std::vector<std::string>& keys,
                                                              Millis timeout,
                                                              std::stop_token stop) override;
  bool check(const std::vector<std::string>& keys) override;
  bool erase(const std::string& key) override;
  int64_t num_keys() override;
  int64_t num_keys_with_prefix(const std::string& prefix) override;
  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  Millis timeout() const override { return Millis(timeout_ms_.load()); }
  void set_timeout(Millis timeout) override { timeout_ms_ = timeout.count(); }

  // One linearizable read (it needs a leader); throws CommError like any call when no
  // member answers.
  void ping();
  // The member the next call goes to first ("host:port"); for messages and tests.
  std::string endpoint() const;
  const EtcdStoreOptions& options() const { return options_; }

 private:
  std::string full(const std::string& key) const { return options_.prefix + key; }
  // Reads `keys` now (txns of at most kReadBatch range ops): a value per present key;
  // `values` false reads existence only.
  std::vector<std::optional<Bytes>> read(const std::vector<std::string>& keys, bool values);
  // What a blocking call waits for: `reached` of a read of its keys (with values or not),
  // woken by watch `events`; `timed_out` is the TimeoutError's message.
  struct Until {
    bool values = false;
    EtcdWatch::Events events = EtcdWatch::Events::kAll;
    std::function<bool(const std::vector<std::optional<Bytes>>&)> reached;
    std::function<std::string()> timed_out;
  };
  // Reads `keys` until `until.reached` or `timeout` passes (TimeoutError), parked on a watch
  // between reads (see the class comment); returns the read that reached it, or nullopt
  // when `stop` is requested.
  std::optional<std::vector<std::optional<Bytes>>> park(const std::vector<std::string>& keys,
                                                        Millis timeout, const Until& until,
                                                        const std::stop_token& stop);
  // park() until every key exists.
  std::optional<std::vector<std::optional<Bytes>>> await(const std::vector<std::string>& keys,
                                                         Millis timeout, bool values,
                                                         const std::stop_token& stop);
  // A watch of `keys`' `events` from etcd's current revision on the member the reads go to,
  // ended by `stop`; nullptr (and a debug line, unless stopped) when none can be made.
  std::unique_ptr<EtcdWatch> watch(const std::vector<std::string>& keys,
                                   std::chrono::steady_clock::time_point deadline,
                                   EtcdWatch::Events events, const std::stop_token& stop);
  // Read-modify-write of one key, retried until its txn lands: `next` maps the current
  // value (nullopt: absent) to the value to write, or nullopt to write nothing. Returns the
  // value after the call and whether this call wrote it. `replayable`: see Replay.
  std::pair<Bytes, bool> cas(
      const std::string& key,
      const std::function<std::optional<Bytes>(const std::optional<Bytes>&)>& next,
      bool replayable);

  EtcdStoreOptions options_;
  std::atomic<int64_t> timeout_ms_;
  std::unique_ptr<EtcdHttp> http_;
  std::atomic<bool> watch_unsupported_{false};  // the member has no /v3/watch: poll
  std::atomic<bool> watch_failed_{false};       // a watch failed once (said at debug)
};

// Splits "host1:2379,host2:2379" (a --rdzv-endpoint value) into endpoints, validating each;
// throws ConfigError naming --rdzv-endpoint.
std::vector<std::string> parse_etcd_endpoints(const std::string& list);

// For the launcher (`weft run --rdzv-backend etcd`): an EtcdStore over `endpoints` with
// keys under `prefix`, get() timeout `timeout`, the default request and failover
// timeouts, that has answered one ping(). Throws ConfigError for bad endpoints and
// CommError when no member answers within the failover timeout (5 s).
std::unique_ptr<Store> make_etcd_store(const std::vector<std::string>& endpoints,
                                       const std::string& prefix,
                                       Millis timeout = kDefaultStoreTimeout);

}  // namespace weft::comm
