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

}  // namespace

LinkFit fit_link(const std::vector<LinkSample>& samples) {
  double small = 0, large = 0;
  bool seen = false;
  for (const LinkSample& p : samples) {
    if (!(p.seconds > 0)) continue;
    small = seen ? std::min(small, p.bytes) : p.bytes;
    large = seen ? std::max(large, p.bytes) : p.bytes;
    seen = true;
  }
  if (!seen || !(large > small))
    throw Error(
        "weft calibrate: the link fit needs probes of at least two message sizes (it got " +
        std::to_string(samples.size()) + " samples)");
  // A term that fits negative is one the samples cannot tell from noise: fix it at 0 and fit
  // the others again.
  std::array<bool, 3> use = {true, true, true};
  Vec x{};
  for (int round = 0; round < 4; ++round) {
    if (!least_squares(samples, use, &x)) {
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
    const auto big = std::max_element(samples.begin(), samples.end(),
                                       [](const LinkSample& a, const LinkSample& b) { return a.bytes < b.bytes; });
    f.bw = big->bytes / big->seconds;
  }
  double sq = 0;
  int n = 0;
  for (const LinkSample& p : samples) {
    if (!(p.seconds > 0)) continue;
    const double model = p.launches * f.launch + p.steps * f.latency + p.bytes / f.bw;
    const double rel = (model - p.seconds) / p.seconds;
    sq += rel * rel, ++n;
    if (std::abs(rel) > f.worst_relative_error) f.worst_relative_error = std::abs(rel), f.worst = p.name;
  }
  f.rms_relative_error = std::sqrt(sq / std::max(1, n));
  return f;
}

}  // namespace weft::launch
