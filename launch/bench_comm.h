// `weft bench comm`: collective bus bandwidth of the Gloo and MPI backends against message
// size, beside this machine's memcpy bandwidth, and the rendezvous store's latency.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launch/args.h"

namespace weft::launch {

// argv[0] is "comm" (the driver), "comm-worker" (one Gloo rank) or "comm-mpi-worker" (one
// MPI rank under mpirun). Returns the exit code; throws ConfigError for bad arguments.
int cmd_bench_comm(const std::vector<std::string>& argv);

// One measurement a worker reports (rank 0 prints it as a JSON line): the median over
// iterations of the slowest rank's time for one call of `op` on `bytes`.
struct CommSample {
  std::string op;  // "all_reduce", "all_gather", "gloo_bcube", "gloo_ring"
  int64_t bytes = 0;
  double seconds = 0;
  int iters = 0;
};

// The samples of one (backend, variant, world size): what the driver prints.
struct CommRun {
  std::string backend;  // "gloo", "mpi"
  std::string variant;  // "" as shipped; MPI: "cma" (single copy), "poll" (spin on done())
  int ranks = 0;
  std::map<std::pair<std::string, int64_t>, CommSample> samples;  // (op, bytes)
  std::string error;                                              // empty when it ran
  std::string label() const {
    return backend + (variant.empty() ? "" : "+" + variant) + " n=" + std::to_string(ranks);
  }
  const CommSample* find(const std::string& op, int64_t bytes) const {
    auto it = samples.find({op, bytes});
    return it == samples.end() ? nullptr : &it->second;
  }
};

// What a variant of MPI did against the shipped settings over the probed sizes.
struct MpiGain {
  double geomean = 0;  // of shipped time / variant time, over both ops and every size
  int64_t from = -1;   // the smallest size from which it won at every larger size, both ops
};

// The tables (bench_comm_report.cc). One column group per run, one row per size.
void print_collective_table(const std::string& op, const std::vector<CommRun>& runs,
                            const std::vector<int64_t>& sizes, double memcpy_gbps);
// How often Gloo's bcube beat its ring at probed sizes up to the backend's switch and above.
struct GlooTally {
  int below = 0, below_bcube_won = 0;
  int above = 0, above_bcube_won = 0;
};
// Gloo's two all-reduce algorithms side by side, tallied per world size against the switch.
std::map<int, GlooTally> print_gloo_probe(const std::vector<CommRun>& runs,
                                          const std::vector<int64_t>& sizes, int64_t switch_bytes);
// MPI as shipped (copy-in/out, Work::wait) against single copy and polling done(), per
// (variant, world size).
std::map<std::pair<std::string, int>, MpiGain> print_mpi_probe(const std::vector<CommRun>& runs,
                                                               const std::vector<CommRun>& probes,
                                                               const std::vector<int64_t>& sizes);

// The worker side (bench_comm_worker.cc): builds a Gloo communicator (rank, world and store
// from the arguments) or an MPI one (from mpirun), times every op over --sizes (and Gloo's two
// all-reduce algorithms over --probe-sizes), and prints one JSON line per sample on rank 0.
int run_comm_worker(const Args& a, bool mpi);

// Iterations timed for a message of `bytes`: many for small messages (latency is noisy),
// two for the largest so the whole benchmark stays within a few minutes on two cores.
int iterations_for(int64_t bytes, bool quick);

// "4 KiB", "256 MiB".
std::string size_label(int64_t bytes);

}  // namespace weft::launch
