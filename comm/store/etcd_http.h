// EtcdHttp: the transport of EtcdStore. One keep-alive HTTP/1.1 connection (Boost.Beast) to
// one member of an etcd cluster at a time, carrying POSTs of etcd's v3 API as JSON to the
// member's gRPC gateway, and failing over to the next member when the current one is lost.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace weft::comm {

// One member's client URL, "host:port" ("http://" accepted; IPv6 as "[::1]:2379").
struct EtcdEndpoint {
  std::string host;
  uint16_t port = 0;
  std::string text() const;  // "host:port", for messages
};

// Parses one endpoint; throws ConfigError naming `field` (e.g. "--rdzv-endpoint") when it
// has no port, a bad port, or asks for TLS ("https://": Weft speaks no TLS).
EtcdEndpoint parse_etcd_endpoint(const std::string& text, const std::string& field);

// Whether a request may be sent again after an attempt whose outcome is unknown: it was
// sent, but no reply came (the member died or request_timeout passed mid-request) or etcd
// answered that the proposal may or may not have been applied ("request timed out",
// "leader changed"). A put is safe to replay; a read-modify-write step (add) is not.
enum class Replay { kSafe, kUnsafe };

// Thread-safe: post() holds a mutex for the whole exchange, failover included, so calls
// from several threads go over the one connection in turn. Never talks to etcd before the
// first post(). Destroy it only when no post() is in flight.
class EtcdHttp {
 public:
  // `endpoints` non-empty (InternalError otherwise; EtcdStore validates them first).
  // `request_timeout` bounds one exchange with one member, `failover_timeout` a whole
  // post() that finds no working member (see post()).
  EtcdHttp(std::vector<EtcdEndpoint> endpoints, Millis request_timeout, Millis failover_timeout);
  ~EtcdHttp();
  EtcdHttp(const EtcdHttp&) = delete;
  EtcdHttp& operator=(const EtcdHttp&) = delete;

  // POSTs `body` to `path` ("/v3/kv/range") and returns etcd's reply as JSON. Blocks for
  // one round trip normally. A member that fails (connect refused, connection broken, no
  // reply within request_timeout, no leader, "request timed out") is left for the next
  // one, round robin, with a short backoff after each full round; the member that answers
  // stays in use for later calls. A follower that forwarded our write to a leader that then
  // died answers only after etcd's own timeout (5 s and more), while another member may
  // serve it as soon as the election is over (a few hundred ms): so while a reply is late
  // (every 100 ms) the call asks the member, on a second connection, for its raft status,
  // and gives the attempt up (its outcome unknown) once the member names a leader of a
  // newer term than the one the request went out in. request_timeout bounds the rest (a
  // member that answers nothing at all). Throws CommError:
  // - naming the member and etcd's message when etcd refuses the request (a value over
  //   --max-request-bytes, too many txn operations, a lease not found);
  // - naming every member's last error when, after each member has failed at least once,
  //   failover_timeout has passed since the call began (so a call ends within
  //   max(failover_timeout, members x request_timeout) plus one backoff);
  // - saying the outcome is unknown when a Replay::kUnsafe request may have been applied.
  nlohmann::json post(const std::string& path, const nlohmann::json& body, Replay replay);

  // The member the next post() tries first ("host:port").
  std::string endpoint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::comm
