// Fork-based multi-process tests (after pytorch's test/cpp/c10d/TestUtils.hpp): run_ranks()
// forks a store server and N ranks, reports what happened to each rank, and always reaps.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/store/store.h"

namespace weft::test {

// What a rank's function sees. Lives in the child process only.
class RankContext {
 public:
  RankContext(int rank, int world, std::string store_host, uint16_t store_port,
              std::chrono::milliseconds store_timeout)
      : rank_(rank),
        world_(world),
        store_host_(std::move(store_host)),
        store_port_(store_port),
        store_timeout_(store_timeout) {}

  int rank() const { return rank_; }
  int world() const { return world_; }
  const std::string& store_host() const { return store_host_; }
  uint16_t store_port() const { return store_port_; }
  std::chrono::milliseconds store_timeout() const { return store_timeout_; }

  // A new client connected to the run's store (a TCPStore with store_timeout()). Each call
  // opens its own connection, so threads of the rank may each take one. Throws CommError
  // when the store cannot be reached.
  std::unique_ptr<comm::Store> store() const;

 private:
  int rank_;
  int world_;
  std::string store_host_;
  uint16_t store_port_;
  std::chrono::milliseconds store_timeout_;
};

struct RunOptions {
  // Ranks still running this long after the fork are killed with SIGKILL and reported as
  // kTimedOut. Keep it below the CTest timeout so the report reaches the test.
  std::chrono::milliseconds deadline{60'000};
  // Timeout of the clients that RankContext::store() returns.
  std::chrono::milliseconds store_timeout{30'000};
};

enum class RankStatus {
  kOk,        // fn returned, no GoogleTest failure inside the rank, exit code 0
  kFailed,    // fn threw, or an EXPECT/ASSERT failed inside the rank (see message)
  kExited,    // the process exited with a non-zero code by itself (exit(), _exit())
  kSignaled,  // killed by a signal it did not get from the harness (a crash, kill -9)
  kTimedOut,  // still running at the deadline; the harness killed it
};
const char* to_string(RankStatus s);

struct RankOutcome {
  int rank = -1;
  RankStatus status = RankStatus::kOk;
  int exit_code = 0;    // valid when the process exited
  int signal = 0;       // valid for kSignaled and kTimedOut (SIGKILL)
  std::string message;  // exception text / failed assertions, as the rank sent them
  bool ok() const { return status == RankStatus::kOk; }
};

struct RunResult {
  std::vector<RankOutcome> ranks;  // indexed by rank
  bool ok() const;
  // One line per failed rank ("rank 2: failed: <message>"); "all N ranks ok" otherwise.
  std::string summary() const;
};

// Forks a TCP store server (port 0 on 127.0.0.1) and `world` ranks, each running fn with its
// RankContext, and returns once every rank has exited or been killed at the deadline. Every
// child is reaped, also when the caller's test fails later.
//
// Call from the test's main thread. The parent starts no thread of its own, so children are
// forked from a process that (unless the test itself started threads) is single-threaded;
// the store server runs in its own forked process for the same reason. Children leave with
// _exit() so no atexit handler or GoogleTest teardown of the parent runs twice, and die with
// the parent (PR_SET_PDEATHSIG) if the test binary crashes. Throws CommError when the store
// server does not start.
RunResult run_ranks(int world, const std::function<void(RankContext&)>& fn,
                    const RunOptions& options = {});

// A Gloo communicator for a rank's function, with the store client it rendezvoused through
// (kept alive beside it: the communicator holds a pointer to it).
struct RankWorld {
  std::unique_ptr<comm::Store> store;
  std::unique_ptr<comm::Communicator> comm;
};

// Rank `rank` of `size` (by default the run's rank and world), keys under `prefix` in the
// run's store, every wait bounded by `timeout`. Collective over those ranks.
RankWorld gloo_world(const RankContext& ctx, const std::string& prefix,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(60'000),
                     int rank = -1, int size = -1);

}  // namespace weft::test
