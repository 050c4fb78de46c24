// NonfiniteGuard: the stop/skip decision and its messages.
#include "launch/nonfinite_guard.h"

#include <cmath>
#include <cstdio>

namespace weft::launch {
namespace {

std::string value_str(double v) {
  if (std::isnan(v)) return "nan";  // printf may write "-nan"
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// "the gradient norm is not finite (nan)" / "the loss is not finite (inf)".
std::string what_went(const core::StepStats& st) {
  const bool loss = st.nonfinite == "loss";
  return "the " + st.nonfinite + " is not finite (" + value_str(loss ? st.loss : st.grad_norm) +
         ")";
}

}  // namespace

NonfiniteGuard::Verdict NonfiniteGuard::observe(const core::StepStats& st) {
  if (st.applied) {
    in_a_row_ = 0;
    return Verdict::kApplied;
  }
  ++in_a_row_;
  if (train_.on_nonfinite != "skip" || in_a_row_ >= train_.max_skipped) return Verdict::kStop;
  return Verdict::kSkipped;
}

std::string NonfiniteGuard::skipped_line(const core::StepStats& st) const {
  const bool loss = st.nonfinite == "loss";
  return "step " + std::to_string(st.step) + "/" + std::to_string(train_.steps) +
         " | skipped: " + (loss ? "loss " : "grad norm ") +
         value_str(loss ? st.loss : st.grad_norm) + " (" + std::to_string(in_a_row_) +
         " in a row, train.max_skipped " + std::to_string(train_.max_skipped) + ")";
}

std::string NonfiniteGuard::stop_message(const core::StepStats& st,
                                         const std::string& first_bad) const {
  std::string m = "train: step " + std::to_string(st.step) + ": " + what_went(st);
  if (!first_bad.empty()) m += "; first non-finite gradient: " + first_bad;
  m += "; the step was not applied";
  if (train_.on_nonfinite == "skip")
    return m + "; " + std::to_string(in_a_row_) +
           " steps in a row were dropped, the limit of train.max_skipped (" +
           std::to_string(train_.max_skipped) +
           "). Lower train.lr (or raise train.warmup_steps, lower train.grad_clip), or raise "
           "train.max_skipped";
  return m + ". Lower train.lr (or raise train.warmup_steps, lower train.grad_clip), or set "
             "train.on_nonfinite: skip";
}

}  // namespace weft::launch
