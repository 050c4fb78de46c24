// The end-of-run report of `weft train`: a table of the loss curve (about a dozen rows
// spread over the run), throughput and memory, printed and saved as summary.txt.
#pragma once

#include <string>
#include <vector>

#include "core/config/job_spec.h"
#include "core/io/metrics.h"
#include "memory/allocator.h"

namespace weft::launch {

class TrainReport {
 public:
  explicit TrainReport(const core::JobSpec& spec) : spec_(spec) {}
  void add_step(const core::io::StepMetrics& m) { steps_.push_back(m); }
  void add_validation(int64_t step, double val) { vals_.push_back({step, val}); }
  std::string summary(double seconds, const memory::AllocatorStats& activations,
                      const std::string& allocator) const;

 private:
  core::JobSpec spec_;
  std::vector<core::io::StepMetrics> steps_;
  std::vector<std::pair<int64_t, double>> vals_;
};

}  // namespace weft::launch
