// The tables of `weft bench comm`: bus bandwidth per size beside memcpy's, Gloo's two
// all-reduce algorithms, and MPI's transport and progress variants.
#include <cmath>
#include <cstdio>

#include "launch/bench_comm.h"

namespace weft::launch {

namespace {

// nccl-tests' bus bandwidth factor: what each rank's link must carry per byte of the message.
double bus_factor(const std::string& op, int n) {
  return op == "all_reduce" ? 2.0 * (n - 1) / n : double(n - 1) / n;
}

}  // namespace

void print_collective_table(const std::string& op, const std::vector<CommRun>& runs,
                            const std::vector<int64_t>& sizes, double memcpy) {
  std::printf(
      "\n== %s: time per call (us, slowest rank, median), bus bandwidth (GB/s), "
      "busbw / memcpy ==\n",
      op.c_str());
  std::printf("%9s", "size");
  for (const CommRun& r : runs) std::printf(" | %-24s", r.label().c_str());
  std::printf("\n%9s", "");
  for (size_t i = 0; i < runs.size(); ++i) std::printf(" | %9s %7s %7s", "us", "busbw", "frac");
  std::printf("\n");
  for (int64_t bytes : sizes) {
    std::printf("%9s", size_label(bytes).c_str());
    for (const CommRun& r : runs) {
      auto it = r.samples.find({op, bytes});
      if (it == r.samples.end()) {
        std::printf(" | %24s", "-");
        continue;
      }
      double bus = double(bytes) / it->second.seconds * bus_factor(op, r.ranks) / 1e9;
      // Significant digits, not decimals: an oversubscribed run's small messages reach 1e-4.
      std::printf(" | %9.1f %7.2g %7.2g", it->second.seconds * 1e6, bus, bus / memcpy);
    }
    std::printf("\n");
  }
}

std::map<int, GlooTally> print_gloo_probe(const std::vector<CommRun>& runs,
                                          const std::vector<int64_t>& sizes, int64_t switch_bytes) {
  std::map<int, GlooTally> tally;
  std::vector<const CommRun*> gloo;
  for (const CommRun& r : runs)
    if (r.backend == "gloo" && r.find("gloo_ring", sizes[0])) gloo.push_back(&r);
  if (gloo.empty()) return tally;
  std::printf(
      "\n== gloo all_reduce, the two algorithms driven directly: us per call "
      "(slowest rank, median) ==\n%9s",
      "size");
  for (const CommRun* r : gloo) std::printf(" | %-22s", r->label().c_str());
  std::printf("\n%9s", "");
  for (size_t i = 0; i < gloo.size(); ++i) std::printf(" | %8s %8s %4s", "bcube", "ring", "best");
  std::printf("\n");
  for (int64_t bytes : sizes) {
    std::printf("%9s", size_label(bytes).c_str());
    for (const CommRun* r : gloo) {
      double b = r->find("gloo_bcube", bytes)->seconds, g = r->find("gloo_ring", bytes)->seconds;
      GlooTally& t = tally[r->ranks];
      (bytes <= switch_bytes ? t.below : t.above) += 1;
      (bytes <= switch_bytes ? t.below_bcube_won : t.above_bcube_won) += b < g;
      std::printf(" | %8.1f %8.1f %4s", b * 1e6, g * 1e6, b < g ? "bcub" : "ring");
    }
    std::printf("\n");
  }
  return tally;
}

std::map<std::pair<std::string, int>, MpiGain> print_mpi_probe(const std::vector<CommRun>& runs,
                                                               const std::vector<CommRun>& probes,
                                                               const std::vector<int64_t>& sizes) {
  std::map<std::pair<std::string, int>, double> log_sum, count;
  std::map<std::pair<std::string, int>, std::map<int64_t, bool>> lost;  // per size, either op
  std::map<std::pair<std::string, int>, MpiGain> out;
  if (probes.empty()) return out;
  for (const char* op : {"all_reduce", "all_gather"}) {
    std::printf(
        "\n== mpi %s busbw GB/s: copy = vader copy-in/out + Work::wait (as above), "
        "cma = single copy, poll = spinning on Work::done() ==\n%9s",
        op, "size");
    std::vector<const CommRun*> base;
    for (const CommRun& r : runs)
      if (r.backend == "mpi") base.push_back(&r), std::printf(" | n=%-19d", r.ranks);
    std::printf("\n%9s", "");
    for (size_t i = 0; i < base.size(); ++i) std::printf(" | %6s %6s %6s", "copy", "cma", "poll");
    std::printf("\n");
    for (int64_t bytes : sizes) {
      std::printf("%9s", size_label(bytes).c_str());
      for (const CommRun* b : base) {
        const CommSample* ref = b->find(op, bytes);
        auto bus = [&](const CommSample* s) {
          return s ? double(bytes) / s->seconds * bus_factor(op, b->ranks) / 1e9 : 0.0;
        };
        std::printf(" | %6.3g", bus(ref));
        for (const char* v : {"cma", "poll"}) {
          const CommSample* s = nullptr;
          for (const CommRun& p : probes)
            if (p.variant == v && p.ranks == b->ranks) s = p.find(op, bytes);
          std::printf(" %6.3g", bus(s));
          if (!s || !ref) continue;
          const std::pair<std::string, int> key{v, b->ranks};
          log_sum[key] += std::log(ref->seconds / s->seconds);
          count[key] += 1;
          lost[key][bytes] = lost[key][bytes] || s->seconds >= ref->seconds;
        }
      }
      std::printf("\n");
    }
  }
  for (auto& [key, sum] : log_sum) {
    MpiGain g{std::exp(sum / count[key]), -1};
    for (auto it = lost[key].rbegin(); it != lost[key].rend() && !it->second; ++it)
      g.from = it->first;
    out[key] = g;
  }
  return out;
}

}  // namespace weft::launch
