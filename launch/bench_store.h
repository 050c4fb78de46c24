// The store half of `weft bench comm`: latency percentiles and throughput of set, get and add
// from many clients against one TCPStoreServer on 127.0.0.1.
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

}  // namespace weft::launch
