// Comparing the loss curves two runs wrote to their metrics.jsonl: the check every launcher
// test (weft run, mpirun, srun, several nodes) makes against one process.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "core/io/metrics.h"

namespace weft::test {

// The training losses (or, with `validation`, the validation losses) in file order.
inline std::vector<double> metrics_losses(const std::filesystem::path& metrics,
                                          bool validation = false) {
  std::vector<double> out;
  for (const auto& row : core::io::read_metrics(metrics.string()))
    if (row.is_validation() == validation) out.push_back(row.at(validation ? "val_loss" : "loss"));
  return out;
}

// The same `count` losses within `rel` relative. Data parallelism regroups sums only: the
// layout tests measure at most 6e-8 over 30 steps (tests/parallel/layout_harness.h).
inline void expect_same_losses(const std::filesystem::path& reference,
                               const std::filesystem::path& run, size_t count,
                               bool validation = false, double rel = 2e-7) {
  std::vector<double> a = metrics_losses(reference, validation), b = metrics_losses(run, validation);
  ASSERT_EQ(a.size(), count) << reference;
  ASSERT_EQ(b.size(), count) << run;
  for (size_t i = 0; i < count; ++i)
    EXPECT_NEAR(b[i], a[i], rel * std::fabs(a[i])) << (validation ? "validation " : "step ") << i;
}

}  // namespace weft::test
