// The collective rules of a calibration (calibration_check.h).
#include "planner/calibration_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>

#include "planner/hardware.h"

namespace weft::planner {
namespace {

// The probe's call sizes, ascending (launch/calibration.cc's names end in these tags).
struct Size {
  const char* tag;
  double bytes;
};
constexpr Size kSizes[] = {
    {"4B", 4}, {"64KiB", 65536}, {"256KiB", 262144}, {"1MiB", 1048576}, {"4MiB", 4194304}};
// The kinds the bytes rule judges, in the order of its texts, and how the texts name them:
// the probe's four, then a model's all-to-alls (description_check.h).
constexpr std::pair<const char*, const char*> kKinds[] = {
    {"ar_world", "all-reduce"}, {"ag_world", "all-gather"}, {"rs_world", "reduce-scatter"},
    {"p2p", "one-way message"}, {"a2a", "all-to-all"},      {"a2av", "all-to-all-v"},
};

const double* find(const std::map<double, double>& m, double bytes) {
  auto it = m.find(bytes);
  return it == m.end() || !(it->second > 0) ? nullptr : &it->second;
}

const std::map<double, double>& kind(const SizedCalls& calls, const std::string& prefix) {
  static const std::map<double, double> none;
  auto it = calls.find(prefix);
  return it == calls.end() ? none : it->second;
}

std::string us(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s * 1e6 >= 100 ? "%.0f us" : "%.3g us", s * 1e6);
  return b;
}

std::string ratio(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2fx", x);
  return b;
}

}  // namespace

std::string size_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && bytes >= 1024) bytes /= 1024, ++u;
  char b[32];
  std::snprintf(b, sizeof b, "%.3g%s", bytes, units[u]);
  return b;
}

std::vector<double> probe_sizes() {
  std::vector<double> out;
  for (const Size& z : kSizes) out.push_back(z.bytes);
  return out;
}

bool judged_world(int world, int cores) { return world <= std::max(2, cores); }

double collective_spread() {
  if (const char* v = std::getenv("WEFT_TEST_COLLECTIVE_SPREAD")) {
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (end != v && x >= 1) return x;
  }
  return kCollectiveSpread;
}

std::vector<CollectiveContradiction> judge_calls(int n, const SizedCalls& calls, double spread,
                                                 const std::string& verb) {
  std::vector<CollectiveContradiction> out;
  const std::string allowed = " (allowed " + ratio(spread) + ")";
  const std::string at = "at " + std::to_string(n) + " processes: ";
  const auto& ars = kind(calls, "ar_world");
  for (const auto& [bytes, t] : ars) {
    const double *ar = find(ars, bytes), *rs = find(kind(calls, "rs_world"), bytes),
                 *ag = find(kind(calls, "ag_world"), bytes);
    if (!ar || !rs || !ag || !(*ar > spread * (*rs + *ag))) continue;
    out.push_back({kDecompositionRule, n, "ar_world_" + size_text(bytes),
                   std::string(kDecompositionRule) + " broken " + at + "the " + size_text(bytes) +
                       " all-reduce " + verb + " " + us(*ar) + ", the reduce-scatter " + us(*rs) +
                       " + the all-gather " + us(*ag) + " = " + us(*rs + *ag) + ", " +
                       ratio(*ar / (*rs + *ag)) + allowed});
  }
  for (const auto& [prefix, words] : kKinds) {
    // Each size against the fastest larger one: a later size taking less than it is the
    // contradiction, whichever of the two the disturbance landed on.
    const auto& m = kind(calls, prefix);
    for (auto small = m.begin(); small != m.end(); ++small) {
      const double* ts = find(m, small->first);
      if (!ts) continue;
      const double* least = nullptr;
      double least_bytes = 0;
      for (auto large = std::next(small); large != m.end(); ++large) {
        const double* tl = find(m, large->first);
        if (tl && (!least || *tl < *least)) least = tl, least_bytes = large->first;
      }
      if (!least || !(*ts > spread * *least)) continue;
      out.push_back({kBytesRule, n, std::string(prefix) + "_" + size_text(small->first),
                     std::string(kBytesRule) + " broken " + at + "the " + size_text(small->first) +
                         " " + words + " " + verb + " " + us(*ts) + ", the " +
                         size_text(least_bytes) + " one " + us(*least) + ", " +
                         ratio(*ts / *least) + allowed});
    }
  }
  return out;
}

std::vector<CollectiveContradiction> check_collectives(const CollectiveTimes& t, int cores) {
  std::vector<CollectiveContradiction> out;
  const double spread = collective_spread();
  for (const auto& [n, m] : t) {
    if (!judged_world(n, cores)) continue;
    // The probe's names ("ar_world_64KiB") as calls by kind and size; other names are not
    // calls the rules judge.
    SizedCalls calls;
    for (const auto& [prefix, words] : kKinds)
      for (const Size& z : kSizes)
        if (auto it = m.find(std::string(prefix) + "_" + z.tag); it != m.end())
          calls[prefix][z.bytes] = it->second;
    const auto found = judge_calls(n, calls, spread, "took");
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

CollectiveTimes recorded_collective_times(const Hardware& hw) {
  CollectiveTimes t;
  for (const auto& [name, v] : hw.measurements) {
    // gloo_n<N>_<call>_s
    int n = 0, used = 0;
    if (std::sscanf(name.c_str(), "gloo_n%d_%n", &n, &used) != 1 || used == 0 || n <= 0) continue;
    if (name.size() < size_t(used) + 3 || name.compare(name.size() - 2, 2, "_s") != 0) continue;
    t[n][name.substr(size_t(used), name.size() - size_t(used) - 2)] = v;
  }
  return t;
}

std::string describe(const std::vector<CollectiveContradiction>& found) {
  std::string s;
  for (const CollectiveContradiction& c : found) s += (s.empty() ? "" : "\n") + c.text;
  return s;
}

}  // namespace weft::planner
