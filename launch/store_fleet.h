// Many store clients in one process without a thread each, for `weft bench store`: 10K
// TCPStore objects would be 10K reader threads, so these connections are driven
// asynchronously on a few threads, speaking TCPStore's wire protocol (comm/store/protocol.h)
// and token handshake (comm/store/auth.h) byte for byte: the server cannot tell them apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/store/store.h"
#include "launch/bench_store.h"

namespace weft::launch {

struct FleetOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string token;  // proven at connect, as workers do with WEFT_JOB_TOKEN
  int threads = 1;    // threads running the clients' io_context
  // Bound on the whole scenario; also the timeout the clients' server-side waits ask for.
  comm::Millis timeout{120'000};
};

// One rendezvous of N clients. Times are seconds from the first client's connect.
struct RendezvousResult {
  int clients = 0;
  int completed = 0;           // clients that did every step and read their peer's value back
  int peak_connected = 0;      // authenticated connections open at once, counted by the clients
  int connect_retries = 0;     // connects refused or reset, retried with backoff like TCPStore's
  double all_connected_s = 0;  // the last client authenticated (and pinged)
  double barrier_s = 0;        // the client that brought the counter to N set the barrier key
  double wall_s = 0;           // the last client done and disconnected
  // Per client: connect, token handshake and one ping (what TCPStore's constructor does).
  double connect_p50_ms = 0, connect_p99_ms = 0, connect_max_ms = 0;
  std::string error;  // the first failure, empty when every client completed
};

// N clients each connect (authenticated), ping, set their own key, add 1 to a shared
// counter, wait for the barrier key that the client bringing the counter to N sets, get the
// next client's key, and disconnect. No client leaves before all N have added, so all N are
// connected at once. Use a fresh server (the keys are fixed names). Never throws for a
// client's failure: it is counted and the first one reported in `error`.
RendezvousResult run_rendezvous(const FleetOptions& o, int clients);

// N clients connect (authenticated) and then, for each of set, get and add in turn, each
// issues that op back to back (one in flight per client) for `seconds`. Throws CommError when
// a client fails or the shared counter does not end at the number of adds.
std::vector<StoreSample> run_load(const FleetOptions& o, int clients, double seconds);

}  // namespace weft::launch
