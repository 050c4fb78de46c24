// Ranks of one forming world as threads of this process: each builds its WorkerWorld (a
// Gloo world, as weft run's workers do) over a store served here, and runs `body` on it.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/store/tcp_store_server.h"
#include "parallel/launch_env.h"

namespace weft::launch {

// Runs `body(rank, communicator)` on `world` threads, rank 0 on the caller's, as ranks of
// membership epoch `epoch`. Returns what each rank threw ("" when nothing).
inline std::vector<std::string> run_world_threads(
    int world, int64_t epoch, const std::function<void(int, comm::Communicator&)>& body) {
  comm::TCPStoreServer server;
  std::vector<std::string> errors(static_cast<size_t>(world));
  auto rank_main = [&](int rank) {
    try {
      parallel::LaunchEnv e;
      e.rank = rank;
      e.world = world;
      e.launcher = "weft run";
      e.store_port = server.port();
      e.rdzv_epoch = epoch;
      e.store_prefix = "rdzv/t/epoch/" + std::to_string(epoch) + "/round/0";
      parallel::WorkerWorld w(e, comm::Millis(30000));
      body(rank, w.comm());
    } catch (const std::exception& ex) {
      errors[size_t(rank)] = ex.what();
    }
  };
  std::vector<std::thread> others;
  for (int r = 1; r < world; ++r) others.emplace_back(rank_main, r);
  rank_main(0);
  for (std::thread& t : others) t.join();
  return errors;
}

}  // namespace weft::launch
