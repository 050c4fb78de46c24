// `weft train` under launchers' variables: torchrun's alone exit 2 saying what to run
// instead (never a silent world of one); a one-task srun step trains.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "tests/support/run_weft.h"

namespace {

namespace fs = std::filesystem;
const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
// The variables of the launchers this test does not fake, cleared (ctest may itself run
// inside a Slurm job or under weft run).
const std::string kClean =
    "env -u WEFT_RANK -u WEFT_WORLD_SIZE -u WEFT_LOCAL_RANK -u WEFT_STORE_ADDR -u "
    "WEFT_STORE_PORT -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMIX_NAMESPACE -u "
    "SLURM_PROCID -u SLURM_NTASKS -u SLURM_STEP_NUM_TASKS -u SLURM_NNODES -u "
    "SLURM_STEP_NUM_NODES -u SLURM_STEP_NODELIST -u RANK -u WORLD_SIZE -u LOCAL_RANK -u "
    "LOCAL_WORLD_SIZE -u GROUP_RANK -u TORCHELASTIC_RUN_ID -u MASTER_ADDR -u MASTER_PORT ";

TEST(LaunchEnvCli, TorchrunVariablesWithoutWeftRunExitTwoSayingWhatToRun) {
  auto r = weft::test::run_command(kClean + "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 " +
                                   WEFT_BINARY + " train --config " + kConfig +
                                   " --set train.steps=2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("launched by torchrun"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("weft run --standalone --nproc-per-node 2 -- weft train"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("| loss"), std::string::npos) << r.out;
}

TEST(LaunchEnvCli, OneTaskSrunStepTrains) {
  fs::path out = fs::temp_directory_path() / ("weft_srun1_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const std::string slurm = "SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_NNODES=1 "
                            "SLURM_JOB_NODELIST='node[01-04]' SLURM_JOB_ID=4242 SLURM_STEP_ID=0 ";
  auto r = weft::test::run_command(kClean + slurm + "OMP_NUM_THREADS=1 " + WEFT_BINARY +
                                   " train --config " + kConfig +
                                   " --set train.steps=2 --set train.warmup_steps=1"
                                   " --set train.log_every=1 --set train.eval_every=0"
                                   " --set train.out_dir=" + out.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step     1/2 | loss"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out / "metrics.jsonl"));
  // The rank does come from Slurm: task 1 of a 1-task step is refused, naming the variable.
  auto bad = weft::test::run_command(kClean + slurm + "SLURM_PROCID=1 " + WEFT_BINARY +
                                     " train --config " + kConfig + " --set train.steps=1");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("SLURM_PROCID"), std::string::npos) << bad.out;
  fs::remove_all(out);
}

}  // namespace
