// EtcdWatch: one etcd v3 watch over the member's gRPC gateway (POST /v3/watch), on a
// connection of its own: the reply is a stream that stays open, one JSON message per line,
// so it cannot share EtcdHttp's request/reply connection. EtcdStore's blocking reads park
// on it instead of polling (etcd_store.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/store/etcd_http.h"

namespace weft::comm {

class EtcdWatch {
 public:
  using Clock = std::chrono::steady_clock;

  // Which events a watch reports: every change, or only removals (etcd's NOPUT filter, so a
  // key set again and again, a heartbeat, sends nothing to a wait for it to go).
  enum class Events { kAll, kDeletes };

  // Connects to `member` and creates a watch of the keys in [key, range_end) ("" range_end:
  // `key` alone) from `start_revision` on, waiting for etcd's "created" until `deadline`.
  // A DELETE event is an erase or a lease's end (a TTL key expiring) alike.
  // The watch asks for a leader (the gateway's hasleader metadata): a member cut off from
  // its cluster cancels it instead of staying silent. `stop`, requested by another thread,
  // ends what the watch is doing at once, its creation included, and every later next().
  // Throws:
  // - EtcdWatchUnsupported when the member answers but not with a watch stream (an etcd
  //   without the v3 gateway's /v3/watch);
  // - CommError naming the member for anything else (unreachable, no reply, refused, stopped).
  EtcdWatch(const EtcdEndpoint& member, const std::string& key, const std::string& range_end,
            int64_t start_revision, Clock::time_point deadline, Events events = Events::kAll,
            std::stop_token stop = {});
  ~EtcdWatch();  // closes the connection, which ends the watch at the member
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // The keys of the events that arrive until `deadline`: returns as soon as one message with
  // events has come (an empty vector when `deadline` passed or the stop came first). Throws
  // CommError when the stream ends or breaks (the member died, lost its leader, or cancelled
  // the watch).
  std::vector<std::string> next(Clock::time_point deadline);

  const EtcdEndpoint& member() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The member answered /v3/watch with something that is not a watch stream.
struct EtcdWatchUnsupported : CommError {
  using CommError::CommError;
};

}  // namespace weft::comm
