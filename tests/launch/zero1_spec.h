// The job the launch tests plan and move state for.
#pragma once

#include "core/config/job_spec.h"

namespace weft::launch {

// A GPT small enough to plan in milliseconds, data parallel over any world with its Adam
// moments sharded (ZeRO-1): each rank's share is state nobody else has, and a move from 2 to
// 3 ranks splits it anew.
inline core::JobSpec zero1_spec() {
  core::JobSpec s;
  s.model.arch = "gpt";
  s.model.layers = 2, s.model.dim = 64, s.model.heads = 4, s.model.vocab = 256;
  s.model.seq_len = 16;
  s.train.global_batch = 12, s.train.micro_batch = 2;
  s.parallel.zero = 1;
  return s;
}

}  // namespace weft::launch
