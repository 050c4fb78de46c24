// The second loss the spare tests end with (live_resize_spare_snapshots_test.cc, replica;
// live_resize_spare_ec_test.cc, ec): the admitted spare dies whole once epoch 2 ran 20 steps,
// and the job must resume from the in-memory snapshots and end with one process's numbers.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "checkpoint/snapshot_segment.h"
#include "tests/support/live_job.h"

namespace weft::test::live {

// Agent `spare` (a member of epoch 2) lost whole; agents 0 and 2 finish the job. Agent 0's
// resize line of epoch 2 -> 3 says world 3 -> 2 and `source` (where the lost rank's state
// came from, e.g. "in-memory snapshots (2 own, 1 replica)"); the losses match `ref`'s; no
// snapshot segment of job `job_id` is left.
inline void expect_second_loss_resumes(LiveJob& job, int spare, const fs::path& ref,
                                       const std::string& source, const std::string& job_id) {
  ASSERT_TRUE(job.wait_world(3, 20, 2)) << job.all_logs();
  ASSERT_NO_FATAL_FAILURE(job.kill_whole(spare));
  job.expect_exits({0, 2});
  const std::string second = job.resize_line("epoch 2 -> 3");
  EXPECT_NE(second.find("world 3 -> 2"), std::string::npos) << job.all_logs();
  EXPECT_NE(second.find(source), std::string::npos) << job.all_logs();
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  EXPECT_TRUE(checkpoint::snapshot_segments(job_id).empty());
}

}  // namespace weft::test::live
