// Slurm's srun, faked on one machine: two `weft train` processes with SLURM_PROCID 0 and 1 of
// a 2-task step meet through the store task 0 serves, and train as one data-parallel job
// with the single process's losses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/io/metrics.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/run_weft.h"

namespace {

namespace fs = std::filesystem;

TEST(Srun, TwoTasksOfOneNodeMatchOneProcess) {
  fs::path d = fs::temp_directory_path() / ("weft_srun2_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string weft = WEFT_BINARY;
  const std::string common = " train --config " + std::string(WEFT_SOURCE_DIR) +
                             "/configs/gpt-layout.yaml --set train.steps=3 "
                             "--set train.warmup_steps=1 --set train.eval_every=0";
  const std::string clean =
      "env -u WEFT_RANK -u WEFT_WORLD_SIZE -u WEFT_STORE_ADDR -u WEFT_STORE_PORT -u "
      "OMPI_COMM_WORLD_SIZE -u PMIX_NAMESPACE -u RANK -u WORLD_SIZE -u LOCAL_RANK "
      "OMP_NUM_THREADS=1 ";
  auto one = weft::test::run_command(clean + weft + common + " --set train.out_dir=" +
                                     (d / "one").string());
  ASSERT_EQ(one.code, 0) << one.out;
  // The port comes from the job and step id, as it would on a cluster.
  const std::string slurm = "SLURM_NTASKS=2 SLURM_NNODES=1 SLURM_JOB_NODELIST=localhost "
                            "SLURM_JOB_ID=" + std::to_string(::getpid()) + " SLURM_STEP_ID=0 ";
  const std::string two = common + " --set parallel.dp=2 --set train.out_dir=" +
                          (d / "two").string();
  std::string script = "( " + clean + slurm + "SLURM_PROCID=1 SLURM_LOCALID=1 timeout 240 " +
                       weft + two + " > " + (d / "task1.log").string() + " 2>&1 & ); " + clean +
                       slurm + "SLURM_PROCID=0 SLURM_LOCALID=0 timeout 240 " + weft + two;
  auto r = weft::test::run_command("bash -c '" + script + "; rc=$?; wait; exit $rc'");
  ASSERT_EQ(r.code, 0) << r.out;
  weft::test::expect_same_losses(d / "one" / "metrics.jsonl", d / "two" / "metrics.jsonl", 3);
  auto rows = weft::core::io::read_metrics((d / "two" / "metrics.jsonl").string());
  EXPECT_EQ(rows.at(0).at("world"), 2);
  fs::remove_all(d);
}

}  // namespace
