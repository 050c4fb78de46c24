#include "launch/link_fit.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "base/error.h"

namespace weft::launch {

namespace {

using Vec = std::array<double, 3>;

// Solves the 3 x 3 system a x = b by Gaussian elimination with partial pivoting; false when
// it is singular (a term no sample varies).
bool solve3(std::array<Vec, 3> a, Vec b, Vec* x) {
  for (int c = 0; c < 3; ++c) {
    int p = c;
    for (int r = c + 1; r < 3; ++r)
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    if (std::abs(a[p][c]) < 1e-12) return false;
    std::swap(a[c], a[p]);
    std::swap(b[c], b[p]);
    for (int r = c + 1; r < 3; ++r) {
      const double f = a[r][c] / a[c][c];
      for (int k = c; k < 3; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (int c = 2; c >= 0; --c) {
    double s = b[c];
    for (int k = c + 1; k < 3; ++k) s -= a[c][k] * (*x)[k];
    (*x)[c] = s / a[c][c];
  }
  return true;
}

// Relative least squares over the columns in `use` (others fixed at 0): rows divided by the
// measured time. Returns the unknowns (launch, latency, seconds per byte).
bool least_squares(const std::vector<LinkSample>& s, const std::array<bool, 3>& use, Vec* x) {
  std::array<Vec, 3> ata{};
  Vec atb{};
  for (const LinkSample& p : s) {
    if (!(p.seconds > 0)) continue;
    const Vec row = {use[0] ? p.launches / p.seconds : 0, use[1] ? p.steps / p.seconds : 0,
                     use[2] ? p.bytes / p.seconds : 0};
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) ata[i][j] += row[i] * row[j];
      atb[i] += row[i];  // the target, seconds / seconds
    }
  }
  for (int i = 0; i < 3; ++i)
    if (!use[i]) ata[i][i] = 1, atb[i] = 0;  // x_i = 0
  return solve3(ata, atb, x);
}

// The terms of the samples with use_sample set (the non-negative fit: a term that fits
// negative is one the samples cannot tell from noise, fixed at 0 and the others fitted again).
LinkFit fit_terms(const std::vector<LinkSample>& samples, const std::vector<char>& use_sample) {
  std::vector<LinkSample> s;
  for (size_t i = 0; i < samples.size(); ++i)
    if (use_sample[i]) s.push_back(samples[i]);
  std::array<bool, 3> use = {true, true, true};
  Vec x{};
  for (int round = 0; round < 4; ++round) {
    if (!least_squares(s, use, &x)) {
      // Singular: a term no sample varies (only one-way messages: no launch to see).
      x = Vec{};
      if (use[0]) use[0] = false;
      else if (use[1]) use[1] = false;
      else break;
      continue;
    }
    bool again = false;
    for (size_t i = 0; i < 3; ++i)
      if (use[i] && x[i] < 0) use[i] = false, again = true;
    if (!again) break;
  }
  LinkFit f;
  f.launch = use[0] ? std::max(0.0, x[0]) : 0;
  f.latency = use[1] ? std::max(0.0, x[1]) : 0;
  if (use[2] && x[2] > 0) {
    f.bw = 1.0 / x[2];
  } else {
    const auto big = std::max_element(s.begin(), s.end(),
                                      [](const LinkSample& a, const LinkSample& b) { return a.bytes < b.bytes; });
    f.bw = big->bytes / big->seconds;
  }
  return f;
}

double model_seconds(const LinkFit& f, const LinkSample& p) {
  return p.launches * f.launch + p.steps * f.latency + p.bytes / f.bw;
}

// Whether the samples with use_sample set still hold two message sizes (the bandwidth).
bool two_sizes(const std::vector<LinkSample>& samples, const std::vector<char>& use_sample) {
  double first = -1;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!use_sample[i]) continue;
    if (first < 0) first = samples[i].bytes;
    else if (samples[i].bytes != first) return true;
  }
  return false;
}

}  // namespace

LinkFit fit_link(const std::vector<LinkSample>& samples) {
  double small = 0, large = 0;
  bool seen = false;
  std::vector<char> use(samples.size(), 0);
  for (size_t i = 0; i < samples.size(); ++i) {
    const LinkSample& p = samples[i];
    if (!(p.seconds > 0)) continue;
    use[i] = 1;
    small = seen ? std::min(small, p.bytes) : p.bytes;
    large = seen ? std::max(large, p.bytes) : p.bytes;
    seen = true;
  }
  if (!seen || !(large > small))
    throw Error(
        "weft calibrate: the link fit needs probes of at least two message sizes (it got " +
        std::to_string(samples.size()) + " samples)");
  // Load outliers: each sample against the fit of the others (leave one out, so that an
  // outlier cannot pull the fit towards itself and hide), the furthest above it rejected
  // while it took more than kLoadOutlier times that prediction; at most a quarter of the
  // samples, and never the last of a second size.
  const int usable = int(std::count(use.begin(), use.end(), 1));
  std::vector<std::string> rejected;
  for (int dropped = 0; 4 * (dropped + 1) <= usable; ++dropped) {
    double worst_ratio = 0;
    size_t worst = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      if (!use[i]) continue;
      use[i] = 0;
      if (two_sizes(samples, use)) {
        const double ratio = samples[i].seconds / model_seconds(fit_terms(samples, use), samples[i]);
        if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
      }
      use[i] = 1;
    }
    if (!is_load_outlier(worst_ratio, 1.0)) break;
    use[worst] = 0;
    rejected.push_back(samples[worst].name);
  }
  LinkFit f = fit_terms(samples, use);
  f.rejected = std::move(rejected);
  double sq = 0;
  int n = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!use[i]) continue;
    const LinkSample& p = samples[i];
    const double rel = (model_seconds(f, p) - p.seconds) / p.seconds;
    sq += rel * rel, ++n;
    if (std::abs(rel) > f.worst_relative_error) f.worst_relative_error = std::abs(rel), f.worst = p.name;
  }
  f.rms_relative_error = std::sqrt(sq / std::max(1, n));
  return f;
}

LoadRobustLevel load_robust_level(const std::vector<LoadSample>& samples) {
  std::vector<LoadSample> s;
  LoadRobustLevel l;
  for (const LoadSample& p : samples)
    if (p.value > 0) s.push_back(p), l.raw += p.value;
  if (s.empty())
    throw Error("weft calibrate: a step-like loop gave no positive time (a probe failed)");
  l.raw /= double(s.size());
  std::stable_sort(s.begin(), s.end(),
                   [](const LoadSample& a, const LoadSample& b) { return a.delay < b.delay; });
  // No delay recorded anywhere: nothing tells the quiet samples apart, every one is kept.
  const bool timed = s.back().delay > 0;
  const size_t quiet = timed ? (s.size() + 3) / 4 : s.size();
  l.rejected = int(s.size() - quiet);  // the more delayed three quarters
  std::vector<double> v;
  for (size_t i = 0; i < quiet; ++i) v.push_back(s[i].value);
  std::vector<double> sorted = v;
  std::nth_element(sorted.begin(), sorted.begin() + long(sorted.size() / 2), sorted.end());
  const double mid = sorted[sorted.size() / 2];
  double sum = 0;
  for (double x : v) {
    if (is_load_outlier(x, mid)) {
      ++l.rejected;
      continue;
    }
    sum += x, ++l.kept;
  }
  l.value = sum / l.kept;
  return l;
}

std::vector<LoadSample> loop_segments(const std::map<std::string, std::vector<double>>& probe,
                                      const std::string& loop) {
  const std::string prefix = loop + "@";
  auto is_delay = [](const std::string& k) {
    return k.size() > 6 && k.compare(k.size() - 6, 6, "_delay") == 0;
  };
  std::vector<LoadSample> all;
  for (auto it = probe.lower_bound(prefix); it != probe.end() && it->first.rfind(prefix, 0) == 0;
       ++it) {
    if (is_delay(it->first)) continue;
    const auto delay = probe.find(it->first + "_delay");
    for (size_t r = 0; r < it->second.size(); ++r)
      all.push_back({it->second[r],
                     delay != probe.end() && r < delay->second.size() ? delay->second[r] : 0.0});
  }
  return all;
}

int refit_non_decreasing(std::vector<std::pair<double, double>>& curve) {
  // Pool adjacent violators: blocks of (sum, count), merged backwards while one's mean
  // exceeds the next's.
  std::vector<std::pair<double, int>> blocks;
  for (const auto& p : curve) {
    blocks.push_back({p.second, 1});
    while (blocks.size() > 1) {
      const auto& b = blocks.back();
      const auto& a = blocks[blocks.size() - 2];
      if (a.first / a.second <= b.first / b.second) break;
      const std::pair<double, int> merged = {a.first + b.first, a.second + b.second};
      blocks.pop_back();
      blocks.back() = merged;
    }
  }
  int moved = 0;
  size_t i = 0;
  for (const auto& [sum, count] : blocks)
    for (int k = 0; k < count; ++k, ++i) {
      const double v = sum / count;
      moved += v != curve[i].second;
      curve[i].second = v;
    }
  return moved;
}

BusyLaunch busy_launch(const LinkFit& f, double busy_ar2, double latency) {
  BusyLaunch b;
  b.idle_call = f.launch + 2 * f.latency;
  b.load_outlier = is_load_outlier(busy_ar2, b.idle_call);
  b.launch = b.load_outlier ? f.launch : std::max(0.0, busy_ar2 - 2 * latency);
  return b;
}

}  // namespace weft::launch
