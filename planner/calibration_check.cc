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
// The kinds whose calls the probe times at several sizes, and how the text names them.
constexpr std::pair<const char*, const char*> kKinds[] = {{"ar_world", "all-reduce"},
                                                          {"ag_world", "all-gather"},
                                                          {"rs_world", "reduce-scatter"},
                                                          {"p2p", "one-way message"}};

const double* find(const std::map<std::string, double>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() || !(it->second > 0) ? nullptr : &it->second;
}

std::string us(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f us", s * 1e6);
  return b;
}

std::string ratio(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2fx", x);
  return b;
}

}  // namespace

bool judged_world(int world, int cores) { return world <= std::max(2, cores); }

double collective_spread() {
  if (const char* v = std::getenv("WEFT_TEST_COLLECTIVE_SPREAD")) {
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (end != v && x >= 1) return x;
  }
  return kCollectiveSpread;
}

std::vector<CollectiveContradiction> check_collectives(const CollectiveTimes& t, int cores) {
  std::vector<CollectiveContradiction> out;
  const double spread = collective_spread();
  const std::string allowed = " (allowed " + ratio(spread) + ")";
  for (const auto& [n, m] : t) {
    if (!judged_world(n, cores)) continue;
    const std::string at = "at " + std::to_string(n) + " processes: ";
    for (const Size& z : kSizes) {
      const double* ar = find(m, std::string("ar_world_") + z.tag);
      const double* rs = find(m, std::string("rs_world_") + z.tag);
      const double* ag = find(m, std::string("ag_world_") + z.tag);
      if (!ar || !rs || !ag || !(*ar > spread * (*rs + *ag))) continue;
      out.push_back({kDecompositionRule, n, std::string("ar_world_") + z.tag,
                     std::string(kDecompositionRule) + " broken " + at + "the " + z.tag +
                         " all-reduce took " + us(*ar) + ", the reduce-scatter " + us(*rs) +
                         " + the all-gather " + us(*ag) + " = " + us(*rs + *ag) + ", " +
                         ratio(*ar / (*rs + *ag)) + allowed});
    }
    for (const auto& [kind, words] : kKinds) {
      // Each size against the fastest larger one: a later size taking less than it is the
      // contradiction, whichever of the two the disturbance landed on.
      for (size_t i = 0; i < std::size(kSizes); ++i) {
        const std::string small = std::string(kind) + "_" + kSizes[i].tag;
        const double* ts = find(m, small);
        if (!ts) continue;
        const double* least = nullptr;
        const char* least_tag = nullptr;
        for (size_t j = i + 1; j < std::size(kSizes); ++j) {
          const double* tl = find(m, std::string(kind) + "_" + kSizes[j].tag);
          if (tl && (!least || *tl < *least)) least = tl, least_tag = kSizes[j].tag;
        }
        if (!least || !(*ts > spread * *least)) continue;
        out.push_back({kBytesRule, n, small,
                       std::string(kBytesRule) + " broken " + at + "the " + kSizes[i].tag + " " +
                           words + " took " + us(*ts) + ", the " + least_tag + " one " +
                           us(*least) + ", " + ratio(*ts / *least) + allowed});
      }
    }
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
