// Store benchmarks. `weft bench comm` ends with latency percentiles and throughput of set,
// get and add from a few TCPStore clients (run_store_bench); `weft bench store` measures
// the store under 1K-10K authenticated clients: a whole rendezvous, and ops/s under load.
#pragma once

#include <string>
#include <vector>

namespace weft::launch {

struct StoreSample {
  int clients = 0;
  std::string op;  // "set", "get", "add"
  double p50_us = 0, p99_us = 0;
  double ops_per_s = 0;
};

// For each client count, starts a fresh server and that many clients (threads, one TCPStore
// connection each), and runs each op back to back for `seconds` per op. Throws CommError when
// the server or a client fails, or when the final counter of `add` is not the number of adds.
std::vector<StoreSample> run_store_bench(const std::vector<int>& clients, double seconds);

// Prints the store table (one row per sample).
void print_store_table(const std::vector<StoreSample>& samples);

// `weft bench store [options]` (see its --help): returns the exit code, 1 when a rendezvous
// did not complete; ConfigError when the open-file limit cannot hold the clients.
int run_store_benchmark(const std::vector<std::string>& args);

// The value below which a fraction p of v lies (v is reordered); 0 for an empty v.
double percentile(std::vector<float>& v, double p);

}  // namespace weft::launch
