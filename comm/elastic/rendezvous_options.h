// The elastic agent's rendezvous options and the timeout hierarchy they must obey.
//
// Timeouts, shortest first, each must be strictly below the next one given:
//
//   collective_timeout  <  step_timeout  <  heartbeat_timeout  <  join_timeout
//   (worker: one op)       (worker: step)    (agent: node lost)    (agent: rendezvous)
//
// Each layer gives up before the layer above it decides: a hung collective is aborted
// before its step is abandoned; a step is abandoned (the worker back at a step boundary,
// ready for a new epoch) before a node would be declared lost, so a slow but live node
// reports a failed step instead of being evicted; and a lost node is detected well before
// a rendezvous gives up, so a re-rendezvous that waits for a dead member's key to expire can
// still finish. Besides: heartbeat_interval < heartbeat_timeout (else a live node's key
// expires between two beats), last_call < join_timeout, poll_interval < heartbeat_timeout.
//
// Defaults: heartbeat_interval 1 s, heartbeat_timeout 5 s, last_call 30 s, join_timeout
// 600 s (torchrun's last_call_timeout and join_timeout), poll_interval 100 ms (torchrun's
// --monitor-interval); collective_timeout and step_timeout belong to the worker and are
// checked only when given. A node is declared lost at most heartbeat_timeout after its last
// beat, and the survivors' next poll (poll_interval later at most) forms the new epoch; when
// the node's processes die and their sockets close, within the store's bound_key_grace
// instead (bind_alive_key).
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace weft::comm {

struct RendezvousOptions {
  using Millis = std::chrono::milliseconds;
  std::string run_id;   // the job (--rdzv-id); keys live under rdzv/<run_id>/
  std::string node_id;  // this agent, unique in the job (check_node_id)
  int min_nodes = 1;    // --nnodes MIN:MAX
  int max_nodes = 1;
  Millis last_call{30'000};                  // --rdzv-conf last_call_timeout
  Millis join_timeout{600'000};              // --rdzv-conf join_timeout
  Millis heartbeat_interval{1'000};          // --rdzv-conf heartbeat_interval
  Millis heartbeat_timeout{5'000};           // --rdzv-conf heartbeat_timeout (the alive keys' TTL)
  Millis poll_interval{100};                 // how often join()/watch() re-read the record
  // Bind the alive key to the agent's store connection where the store can (heartbeat.h):
  // a node whose processes die is then known lost within the store's bound_key_grace (250 ms
  // by default) plus a poll_interval, not heartbeat_timeout; the TTL stays the fallback for
  // a host that vanishes without closing its connection. Over etcd the key is a TTL key
  // whatever this says (etcd_store.h).
  bool bind_alive_key = true;
  std::optional<Millis> collective_timeout;  // --rdzv-conf collective_timeout (worker's)
  std::optional<Millis> step_timeout;        // --rdzv-conf step_timeout (worker's)
};

// Throws ConfigError naming the flag or --rdzv-conf key at fault ("--rdzv-conf
// heartbeat_timeout: ...", "--nnodes: ...", "--rdzv-id: ...") and the fix.
void validate(const RendezvousOptions& options);

}  // namespace weft::comm
