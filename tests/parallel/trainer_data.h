// The job and the training data of an in-process multi-rank trainer test (trainer_adopt,
// trainer_parts, trainer_finish, trainer_groups): loaded in the parent before any fork, so
// every forked rank reads the same batches.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "core/config/job_spec.h"
#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"
#include "tests/parallel/layout_harness.h"
#include "tests/support/multiprocess.h"

namespace weft::test {

// configs/<config> with `sets` as layout_spec loads it (threads 1, eval off).
inline core::JobSpec trainer_spec(const std::string& config, std::vector<std::string> sets) {
  LayoutCase c;
  c.config = config;
  c.overrides = std::move(sets);
  return layout_spec(c);
}

// The harness's options for these tests' ranks: a trainer's reference run and the run under
// test, each some steps of a small model on one core shared by `world` processes.
inline RunOptions trainer_run_options() {
  RunOptions ro;
  ro.deadline = std::chrono::milliseconds(300'000);
  return ro;
}

struct TrainData {
  explicit TrainData(const core::JobSpec& spec) : set(load(spec)) {}
  TrainData(const TrainData&) = delete;
  TrainData& operator=(const TrainData&) = delete;

  // Reads `set`: valid while this object lives.
  core::BatchFn batch() {
    return [this](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
      set.fill_train(s, b0, n, x, y);
    };
  }

  core::data::TokenDataset set;

 private:
  static core::data::TokenDataset load(const core::JobSpec& spec) {
    core::cpu::set_num_threads(1);  // no OpenMP threads in the parent we fork from
    return core::data::TokenDataset::load(spec);
  }
};

}  // namespace weft::test
