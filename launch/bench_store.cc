// Store latency under load: N client threads, each with its own connection (as N ranks of a
// job would have), issue one op back to back; the server is a single Asio thread, so this
// shows where rendezvous and heartbeats start to queue behind each other.
#include "launch/bench_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "base/check.h"
#include "base/error.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"

namespace weft::launch {
namespace {

using Clock = std::chrono::steady_clock;

// A value the size of a typical rendezvous entry (an address, a small id).
const comm::Bytes kValue(32, uint8_t{'x'});

StoreSample run_one(comm::TCPStoreServer& server, int clients, const std::string& op,
                    double seconds) {
  std::vector<std::unique_ptr<comm::TCPStore>> conns;
  for (int i = 0; i < clients; ++i) {
    conns.push_back(std::make_unique<comm::TCPStore>("127.0.0.1", server.port()));
    conns.back()->set("bench/" + std::to_string(i), kValue);  // what get() reads
  }
  const std::string counter = "bench/counter/" + std::to_string(clients);
  std::vector<std::vector<float>> lat(static_cast<size_t>(clients));  // microseconds
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::mutex err_mu;
  std::exception_ptr err;
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      try {
        comm::TCPStore& s = *conns[size_t(i)];
        const std::string key = "bench/" + std::to_string(i);
        auto& l = lat[size_t(i)];
        l.reserve(1 << 16);
        ready.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        const auto end = Clock::now() + std::chrono::duration<double>(seconds);
        for (auto t0 = Clock::now(); t0 < end;) {
          if (op == "set")
            s.set(key, kValue);
          else if (op == "get")
            s.get(key);
          else
            s.add(counter, 1);  // one shared counter: the contended case (barriers)
          auto t1 = Clock::now();
          l.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
          t0 = t1;
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (!err) err = std::current_exception();
      }
    });
  }
  while (ready.load() < clients && !err) std::this_thread::yield();
  auto t0 = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  if (err) std::rethrow_exception(err);
  std::vector<float> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  if (op == "add") {
    int64_t total = conns[0]->add(counter, 0);
    WEFT_ENSURE(total == int64_t(all.size()), CommError, "bench store: counter reads ", total,
                " after ", all.size(), " adds");
  }
  StoreSample s{clients, op, 0, 0, double(all.size()) / wall};
  s.p50_us = percentile(all, 0.50);
  s.p99_us = percentile(all, 0.99);
  return s;
}

}  // namespace

double percentile(std::vector<float>& v, double p) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, size_t(p * double(v.size())));
  std::nth_element(v.begin(), v.begin() + ptrdiff_t(k), v.end());
  return v[k];
}

std::vector<StoreSample> run_store_bench(const std::vector<int>& clients, double seconds) {
  std::vector<StoreSample> out;
  for (int n : clients) {
    comm::TCPStoreServerOptions o;
    o.host = "127.0.0.1";
    comm::TCPStoreServer server(o);  // fresh per client count: no keys or sessions carried over
    for (const char* op : {"set", "get", "add"}) out.push_back(run_one(server, n, op, seconds));
  }
  return out;
}

void print_store_table(const std::vector<StoreSample>& samples) {
  std::printf(
      "\n== store: one TCPStoreServer on 127.0.0.1, one connection per client, "
      "32-byte values ==\n");
  std::printf("%7s %4s | %9s %9s | %9s\n", "clients", "op", "p50 us", "p99 us", "ops/s");
  for (const StoreSample& s : samples)
    std::printf("%7d %4s | %9.1f %9.1f | %9.0f\n", s.clients, s.op.c_str(), s.p50_us, s.p99_us,
                s.ops_per_s);
}

}  // namespace weft::launch
