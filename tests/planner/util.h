
// Shared helpers for the planner tests: small job specs built in code and plan queries.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/config/job_spec.h"
#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/planner.h"
#include "planner/rvd.h"

namespace weft::planner::test_util {

inline core::JobSpec gpt_spec(int64_t layers = 2, int64_t dim = 64, int64_t heads = 4, int64_t vocab = 256,
                              int64_t seq = 16) {
  core::JobSpec s;
  s.model.arch = "gpt";
  s.model.layers = layers;
  s.model.dim = dim;
  s.model.heads = heads;
  s.model.vocab = vocab;
  s.model.seq_len = seq;
  s.data.path = "/usr/share/games/fortunes";
  s.train.global_batch = 8;
  s.train.micro_batch = 2;
  s.parallel.dp = 0;
  return s;
}

inline core::JobSpec moe_spec(int64_t experts = 4, int64_t top_k = 2) {
  core::JobSpec s = gpt_spec();
  s.model.arch = "moe-gpt";
  s.model.moe.experts = experts;
  s.model.moe.top_k = top_k;
  return s;
}

// Collective instructions of one role matching `pred`.
inline std::vector<const Instr*> collectives(const Role& r, const std::function<bool(const Instr&)>& pred) {
  std::vector<const Instr*> out;
  for (const Instr& in : r.program)
    if (in.kind == InstrKind::kCollective && pred(in)) out.push_back(&in);
  return out;
}

inline ConfigError config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "expected a ConfigError";
  return ConfigError("", "");
}

// A hardware file's measured wait curve under `key` ([burst s, wait s] points, bursts
// increasing): out-of-order bursts, a negative wait and a scalar are ConfigErrors naming the
// key and the point.
inline void expect_bad_wait_curves_name_the_field(const std::string& key) {
  const std::string base = hardware_to_yaml(load_hardware("h100"));
  auto err = [&](const std::string& curve) {
    return std::string(config_error([&] { hardware_from_yaml(base + curve, "t.yaml"); }).what());
  };
  const std::string field = "hardware." + key;
  EXPECT_NE(err(key + ": [[1e-3, 1e-4], [1e-4, 2e-4]]\n").find(field + "[1]"), std::string::npos);
  EXPECT_NE(err(key + ": [[0, 1e-4]]\n").find("the burst must be > 0"), std::string::npos);
  EXPECT_NE(err(key + ": [[1e-3, -1]]\n").find(field + "[0]"), std::string::npos);
  EXPECT_NE(err(key + ": [[1e-3, -1]]\n").find("the wait must be"), std::string::npos);
  EXPECT_NE(err(key + ": [1e-3]\n").find(field + "[0]"), std::string::npos);
  EXPECT_NE(err(key + ": 3\n").find(field), std::string::npos);
}

// An RVD path's collectives as "kind/factor", in order (its chunks, which move nothing, left
// out).
inline std::vector<std::string> collectives_of(const RvdPath& p) {
  std::vector<std::string> out;
  for (const Move& m : p.moves)
    if (m.kind != MoveKind::kChunk)
      out.push_back(std::string(move_name(m.kind)) + "/" + std::to_string(m.factor));
  return out;
}

// The mesh order of the stage-cost tests: tp innermost, then ep, dp, pp.
inline const std::vector<Axis> kStageOrder{Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp};

// A 2-core host running every rank on one node (this VM's shape), each collective
// `launch_oversub` seconds more when the node is oversubscribed.
inline CostModel two_core_host(double launch_oversub) {
  CostModel cm;
  cm.cores = 2;
  cm.ranks_per_node = 1 << 20;
  cm.launch_oversub = launch_oversub;
  return cm;
}

}  // namespace weft::planner::test_util
