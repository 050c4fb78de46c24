// TrainReport: the loss-curve table with a bar per row, and the run's totals.
#include "launch/train_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace weft::launch {
namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

}  // namespace

std::string TrainReport::summary(double seconds, const memory::AllocatorStats& act,
                                 const std::string& allocator) const {
  std::string s = "\n== loss curve ==\n";
  if (steps_.empty()) return s + "(no steps)\n";
  std::map<int64_t, double> val(vals_.begin(), vals_.end());
  double lo = 1e300, hi = -1e300;
  for (const auto& m : steps_) lo = std::min(lo, m.loss), hi = std::max(hi, m.loss);
  const int rows = 12, width = 40;
  size_t every = std::max<size_t>(1, (steps_.size() + rows - 1) / rows);
  s += "  step |  train loss |   val loss | \n";
  for (size_t i = 0; i < steps_.size(); ++i) {
    if (i % every != 0 && i + 1 != steps_.size()) continue;
    const auto& m = steps_[i];
    int bar = hi > lo ? int(std::lround((m.loss - lo) / (hi - lo) * width)) : width;
    auto v = val.find(m.step);
    s += fmt("%6.0f | %11.4f | ", double(m.step), m.loss);
    s += v != val.end() ? fmt("%10.4f | ", v->second) : std::string("           | ");
    s += std::string(size_t(std::max(1, bar)), '#') + "\n";
  }
  const double tokens =
      double(steps_.size()) * double(spec_.train.global_batch * spec_.model.seq_len);
  s += "\n== summary ==\n";
  s += fmt("steps %.0f, %.1f s, %.0f tokens/s on average\n", double(steps_.size()), seconds,
           tokens / std::max(seconds, 1e-9));
  s += fmt("loss %.4f -> %.4f", steps_.front().loss, steps_.back().loss);
  if (!vals_.empty()) s += fmt(", val_loss %.4f", vals_.back().second);
  s += "\n";
  s += "activation memory (" + allocator + " allocator): ";
  s += fmt("peak live %.1f MiB, peak reserved %.1f MiB, fragmentation %.1f%%\n",
           double(act.bytes_live_peak) / 1048576.0, double(act.bytes_reserved_peak) / 1048576.0,
           100.0 * act.fragmentation());
  return s;
}

}  // namespace weft::launch
