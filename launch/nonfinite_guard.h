// What `weft train` does with a step whose loss or gradient norm was not finite (the trainers
// drop its update): train.on_nonfinite stop | skip, and train.max_skipped in a row.
#pragma once

#include <cstdint>
#include <string>

#include "core/config/job_spec.h"
#include "core/exec/trainer.h"

namespace weft::launch {

class NonfiniteGuard {
 public:
  enum class Verdict { kApplied, kSkipped, kStop };

  explicit NonfiniteGuard(const core::TrainSpec& t) : train_(t) {}

  // After each step, on every rank with the same statistics (so every rank decides alike).
  Verdict observe(const core::StepStats& st);
  // The progress line of a dropped step: "step 3/6 | skipped: grad norm nan (1 in a row,
  // train.max_skipped 5)".
  std::string skipped_line(const core::StepStats& st) const;
  // The failure (exit 1) after a kStop verdict: the step, the quantity, the first parameter
  // whose gradient went non-finite (`first_bad`, empty when unknown) and the fix.
  std::string stop_message(const core::StepStats& st, const std::string& first_bad) const;

 private:
  const core::TrainSpec& train_;
  int64_t in_a_row_ = 0;
};

}  // namespace weft::launch
