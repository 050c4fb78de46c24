// Save-and-resume across layouts with real processes: a run under layout A saves at step
// `save_at` (checkpoint.every) and goes on; a run under layout B (or the single-process
// trainer) resumes from that checkpoint; both compared with the uninterrupted single process.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/log.h"
#include "checkpoint/parallel_state.h"
#include "checkpoint/trainer_state.h"
#include "comm/registry.h"
#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"
#include "parallel/launch_env.h"
#include "parallel/trainer.h"
#include "tests/parallel/layout_harness.h"
#include "tests/support/multiprocess.h"

namespace weft::test::resume {

namespace fs = std::filesystem;

struct ResumeCase {
  std::string config;                  // under configs/
  int save_world = 4;                  // ranks of the saving run
  std::vector<std::string> save_sets;  // its parallel overrides
  int resume_world = 2;                // 1: the single-process core::Trainer
  std::vector<std::string> resume_sets;
  int save_at = 10, steps = 13;
  double tolerance = 1e-6;  // relative, per step's loss, against one process
  bool bitwise = false;     // same layout: the losses equal the saving run's
};

struct ResumeOutcome {
  std::string failure;
  std::vector<double> reference;  // one process, uninterrupted, steps 0..steps-1
  std::vector<double> saved;      // the saving run, uninterrupted, steps 0..steps-1
  std::vector<double> resumed;    // the resumed run, steps save_at..steps-1
  int64_t resumed_at = -1;
  double max_rel = 0;          // worst |resumed - reference| / |reference|
  bool bitwise_equal = false;  // resumed == saved from save_at on, bit for bit
};

inline core::JobSpec spec_with(const ResumeCase& c, const std::vector<std::string>& sets,
                               const std::string& ckpt_dir, int64_t every) {
  LayoutCase lc;
  lc.config = c.config;
  lc.steps = c.steps;
  lc.overrides = sets;
  core::JobSpec s = layout_spec(lc);
  s.checkpoint.dir = ckpt_dir;
  s.checkpoint.every = every;
  s.checkpoint.keep = 2;
  return s;
}

inline std::vector<double> read_losses(const std::string& path) {
  std::vector<double> v;
  std::ifstream in(path);
  double l;
  while (in >> l) v.push_back(l);
  return v;
}

inline std::unique_ptr<comm::Communicator> world_of(RankContext& ctx,
                                                    std::unique_ptr<comm::Store>& store,
                                                    const std::string& prefix) {
  log_set_rank(ctx.rank());
  store = ctx.store();
  comm::CommOptions co;
  co.rank = ctx.rank();
  co.size = ctx.world();
  co.store = store.get();
  co.prefix = prefix;
  co.timeout = std::chrono::milliseconds(60'000);
  return comm::make_communicator(comm::BackendKind::kGloo, co);
}

// Runs the case: reference, the saving run, the resumed run.
inline ResumeOutcome run_resume(const ResumeCase& c) {
  ResumeOutcome out;
  fs::path dir = fs::temp_directory_path() / ("weft_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string ckpt = (dir / "ckpt").string(), saved = (dir / "saved.txt").string(),
                    resumed = (dir / "resumed.txt").string();
  core::JobSpec spec_a = spec_with(c, c.save_sets, ckpt, c.save_at);
  core::JobSpec spec_b = spec_with(c, c.resume_sets, (dir / "unused").string(), 0);
  core::cpu::set_num_threads(1);  // no OpenMP threads in the parent we fork from
  core::data::TokenDataset data = core::data::TokenDataset::load(spec_a);
  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  {
    core::JobSpec single = spec_a;
    single.parallel = core::ParallelSpec();
    core::Trainer t(single);
    for (int s = 0; s < c.steps; ++s) out.reference.push_back(t.step(batch).loss);
  }
  RunOptions ro;
  ro.deadline = std::chrono::milliseconds(400'000);
  RunResult ra = run_ranks(
      c.save_world,
      [&](RankContext& ctx) {
        std::unique_ptr<comm::Store> store;
        auto world = world_of(ctx, store, "save");
        parallel::ParallelTrainer pt(spec_a, *world);
        checkpoint::ParallelCheckpoints ck(spec_a, pt);
        std::ostringstream os;
        os.precision(17);
        while (pt.current_step() < c.steps) {
          os << pt.step(batch).loss << "\n";
          ck.after_step();
        }
        if (ctx.rank() == 0) std::ofstream(saved) << os.str();
      },
      ro);
  if (!ra.ok()) {
    out.failure = "saving run: " + ra.summary();
    return out;
  }
  out.saved = read_losses(saved);
  if (c.resume_world == 1) {
    core::JobSpec single = spec_b;
    single.parallel = core::ParallelSpec();
    core::Trainer t(single);
    checkpoint::TrainerCheckpoints ck(single, t, ckpt);
    out.resumed_at = t.current_step();
    while (t.current_step() < c.steps) out.resumed.push_back(t.step(batch).loss);
  } else {
    RunResult rb = run_ranks(
        c.resume_world,
        [&](RankContext& ctx) {
          std::unique_ptr<comm::Store> store;
          auto world = world_of(ctx, store, "resume");
          parallel::ParallelTrainer pt(spec_b, *world);
          checkpoint::ParallelCheckpoints ck(spec_b, pt, ckpt);
          std::ostringstream os;
          os.precision(17);
          os << pt.current_step() << "\n";
          while (pt.current_step() < c.steps) os << pt.step(batch).loss << "\n";
          if (ctx.rank() == 0) std::ofstream(resumed) << os.str();
        },
        ro);
    if (!rb.ok()) {
      out.failure = "resumed run: " + rb.summary();
      return out;
    }
    std::vector<double> v = read_losses(resumed);
    if (!v.empty()) {
      out.resumed_at = int64_t(v.front());
      out.resumed.assign(v.begin() + 1, v.end());
    }
  }
  fs::remove_all(dir);
  if (out.resumed.size() != size_t(c.steps - c.save_at)) {
    out.failure = "the resumed run reported " + std::to_string(out.resumed.size()) + " steps";
    return out;
  }
  out.bitwise_equal = out.saved.size() == size_t(c.steps);
  for (size_t i = 0; i < out.resumed.size(); ++i) {
    const double ref = out.reference.at(size_t(c.save_at) + i), got = out.resumed[i];
    out.max_rel = std::max(out.max_rel, std::fabs(got - ref) / std::max(std::fabs(ref), 1e-12));
    if (out.bitwise_equal && out.saved[size_t(c.save_at) + i] != got) out.bitwise_equal = false;
  }
  return out;
}

// A gpt-layout run on two ranks (dp2) for `steps` steps, saving every `every` steps under
// `root` (checkpoint.keep 2).
inline void save_dp2(const std::string& root, int steps, int every) {
  ResumeCase c;
  c.config = "gpt-layout.yaml";
  core::JobSpec spec = spec_with(c, {"parallel.dp=2"}, root, every);  // 13 steps planned
  core::cpu::set_num_threads(1);
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);
  RunResult r = run_ranks(2, [&](RankContext& ctx) {
    std::unique_ptr<comm::Store> store;
    auto world = world_of(ctx, store, "save");
    parallel::ParallelTrainer pt(spec, *world);
    checkpoint::ParallelCheckpoints ck(spec, pt);
    for (int s = 0; s < steps; ++s) {
      pt.step([&](int64_t st, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
        data.fill_train(st, b0, n, x, y);
      });
      ck.after_step();
    }
  });
  ASSERT_TRUE(r.ok()) << r.summary();
}

inline std::string sets_str(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
  return s.empty() ? "one process" : s;
}

// GoogleTest checks, printing the measured deviation (the test log is the table).
inline void expect_resumed(const ResumeCase& c, const ResumeOutcome& o) {
  ASSERT_TRUE(o.failure.empty()) << o.failure;
  std::printf(
      "[resume] %-15s save %d ranks (%s) at step %d -> resume %d ranks (%s): "
      "steps %d..%d, max rel loss dev %.3g vs one process, bitwise vs the saving run %s\n",
      c.config.c_str(), c.save_world, sets_str(c.save_sets).c_str(), c.save_at, c.resume_world,
      sets_str(c.resume_sets).c_str(), c.save_at, c.steps - 1, o.max_rel,
      o.bitwise_equal ? "yes" : "no");
  EXPECT_EQ(o.resumed_at, c.save_at);
  EXPECT_LE(o.max_rel, c.tolerance);
  if (c.bitwise) {
    EXPECT_TRUE(o.bitwise_equal) << "the layout is unchanged: bit for bit";
  }
  ASSERT_GE(o.resumed.size(), 2u);
  EXPECT_NE(o.resumed.front(), o.resumed.back()) << "a real training run: the loss moves";
}

}  // namespace weft::test::resume
