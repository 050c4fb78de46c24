// detect_launch_env on the variables of each launcher, set in-process: weft run's own win;
// mpirun's, then srun's (first host of the node list, agreed port); torchrun's alone are
// refused with what to run instead, unless they describe a single process.
#include "parallel/launch_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "base/error.h"

namespace weft::parallel {
namespace {

// Clears every variable detect_launch_env reads, sets the test's, restores all afterwards.
class LaunchEnvTest : public ::testing::Test {
 protected:
  static constexpr const char* kVars[] = {
      "WEFT_RANK", "WEFT_LOCAL_RANK", "WEFT_WORLD_SIZE", "WEFT_STORE_ADDR", "WEFT_STORE_PORT",
      "WEFT_STORE_PREFIX",
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
      "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_PROCID", "SLURM_NTASKS",
      "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST",
      "SLURM_STEP_NODELIST", "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_JOB_ID",
      "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID", "RANK", "WORLD_SIZE", "LOCAL_RANK",
      "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"};
  void SetUp() override {
    for (const char* v : kVars) {
      if (const char* x = std::getenv(v)) saved_[v] = x;
      ::unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char* v : kVars) {
      ::unsetenv(v);
      if (saved_.count(v)) ::setenv(v, saved_[v].c_str(), 1);
    }
  }
  void set(std::map<std::string, std::string> vars) {
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  // The ConfigError's text, or nullopt when detect_launch_env returned.
  std::optional<std::string> error() {
    try {
      detect_launch_env();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::nullopt;
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(LaunchEnvTest, NothingSetIsOneProcess) {
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.launcher, "single");
  EXPECT_EQ(e.world, 1);
  EXPECT_FALSE(e.host_store);
}

TEST_F(LaunchEnvTest, SrunGivesRanksAndTheFirstHostServesTheStore) {
  set({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},
       {"SLURM_NNODES", "4"}, {"SLURM_JOB_NODELIST", "node[01-04]"}, {"SLURM_JOB_ID", "77"},
       {"SLURM_STEP_ID", "0"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.launcher, "srun");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.store_host, "node01");
  EXPECT_EQ(e.bind_host, "0.0.0.0");
  EXPECT_FALSE(e.host_store);
  EXPECT_GE(e.store_port, 20000);
  EXPECT_LT(e.store_port, 40000);
  // Every task of the step agrees on the port without talking; another step gets another.
  uint16_t port = e.store_port;
  set({{"SLURM_PROCID", "0"}});
  LaunchEnv zero = detect_launch_env();
  EXPECT_EQ(zero.store_port, port);
  EXPECT_TRUE(zero.host_store);
  set({{"SLURM_STEP_ID", "1"}});
  EXPECT_NE(detect_launch_env().store_port, port);
  // WEFT_STORE_PORT picks the port; the step's own node list and task count come first.
  set({{"WEFT_STORE_PORT", "31234"}, {"SLURM_STEP_NODELIST", "gpu[7,9]"},
       {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_NUM_NODES", "2"}});
  LaunchEnv step = detect_launch_env();
  EXPECT_EQ(step.store_port, 31234);
  EXPECT_EQ(step.store_host, "gpu7");
  EXPECT_EQ(step.world, 2);
}

TEST_F(LaunchEnvTest, SrunOnOneNodeStaysOnLoopback) {
  set({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_NNODES", "1"},
       {"SLURM_JOB_NODELIST", "node07"}, {"SLURM_JOB_ID", "5"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.launcher, "srun");
  EXPECT_EQ(e.world, 1);
  EXPECT_EQ(e.store_host, "127.0.0.1");
  EXPECT_EQ(e.bind_host, "");
  EXPECT_TRUE(e.host_store);
}

TEST_F(LaunchEnvTest, SrunErrorsNameTheVariable) {
  set({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "5"}});
  EXPECT_EQ(error().value_or("").rfind("SLURM_PROCID:", 0), 0u) << error().value_or("");
  set({{"SLURM_PROCID", "0"}, {"SLURM_NNODES", "2"}, {"SLURM_JOB_NODELIST", "node[01-02"}});
  EXPECT_EQ(error().value_or("").rfind("SLURM_JOB_NODELIST:", 0), 0u) << error().value_or("");
  ::unsetenv("SLURM_JOB_ID");
  set({{"SLURM_JOB_NODELIST", "node[01-02]"}});
  EXPECT_EQ(error().value_or("").rfind("WEFT_STORE_PORT:", 0), 0u) << error().value_or("");
  // WEFT_STORE_ADDR names a store someone else serves.
  set({{"WEFT_STORE_ADDR", "head:4000"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.store_host, "head");
  EXPECT_EQ(e.store_port, 4000);
  EXPECT_FALSE(e.host_store);
}

TEST_F(LaunchEnvTest, SlurmFirstHost) {
  EXPECT_EQ(slurm_first_host("node[01-04]"), "node01");
  EXPECT_EQ(slurm_first_host("a,b"), "a");
  EXPECT_EQ(slurm_first_host("node[1,3-5]"), "node1");
  EXPECT_EQ(slurm_first_host("node[3-5,1]"), "node3");
  EXPECT_EQ(slurm_first_host("single"), "single");
  EXPECT_EQ(slurm_first_host("gpu-[003-005,010],cpu01"), "gpu-003");
  EXPECT_EQ(slurm_first_host("r[1-2]-n[3-4]"), "r1-n3");
  EXPECT_EQ(slurm_first_host("node[01-02].cluster"), "node01.cluster");
  for (const char* bad : {"", "node[01", "node]01", "[", "a[[1]]"}) {
    try {
      slurm_first_host(bad, "SLURM_STEP_NODELIST");
      ADD_FAILURE() << bad;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "SLURM_STEP_NODELIST") << bad;
    }
  }
}

TEST_F(LaunchEnvTest, MpirunWinsOverSlurmInsideAnAllocation) {
  set({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"PMIX_NAMESPACE", "j"},
       {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.world, 2);
  EXPECT_EQ(e.rank, 1);
}

// mpirun's job names the store's ports (rank 0 skips a taken one); WEFT_STORE_PORT fixes one.
TEST_F(LaunchEnvTest, MpirunsJobNamesTheStorePortsAndWeftStorePortFixesOne) {
  set({{"OMPI_COMM_WORLD_SIZE", "2"},
       {"OMPI_COMM_WORLD_RANK", "1"},
       {"PMIX_NAMESPACE", "prterun-h-77@1"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.store_job, "prterun-h-77@1");
  EXPECT_FALSE(e.host_store);
  EXPECT_EQ(agreed_store_ports(e).front(), e.store_port);
  EXPECT_GE(agreed_store_ports(e).size(), size_t(kAgreedPortTries - 1));
  set({{"WEFT_STORE_PORT", "31235"}});
  LaunchEnv fixed = detect_launch_env();
  EXPECT_EQ(fixed.store_job, "");
  EXPECT_EQ(agreed_store_ports(fixed), std::vector<uint16_t>{31235});
}

TEST_F(LaunchEnvTest, TorchrunAloneIsRefusedWithWhatToRun) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}});
  std::string e = error().value_or("");
  EXPECT_EQ(e.rfind("WORLD_SIZE:", 0), 0u) << e;
  EXPECT_NE(e.find("launched by torchrun (RANK, WORLD_SIZE, MASTER_ADDR set)"), std::string::npos) << e;
  EXPECT_NE(e.find("weft run --standalone --nproc-per-node 2 -- weft train"), std::string::npos) << e;
  // Any sign of a second process is enough; LOCAL_WORLD_SIZE names the per-node count.
  SetUp();
  set({{"LOCAL_RANK", "1"}});
  EXPECT_TRUE(error().has_value());
  SetUp();
  set({{"TORCHELASTIC_RUN_ID", "x"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_NE(error().value_or("").find("--nproc-per-node 4"), std::string::npos) << error().value_or("");
}

TEST_F(LaunchEnvTest, TorchrunOfOneProcessOrStrayVariablesTrainAlone) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"TORCHELASTIC_RUN_ID", "x"},
       {"MASTER_ADDR", "127.0.0.1"}});
  EXPECT_EQ(detect_launch_env().world, 1);
  SetUp();
  set({{"RANK", "captain"}});  // not a number: not a launcher's
  EXPECT_EQ(detect_launch_env().world, 1);
}

TEST_F(LaunchEnvTest, WeftRunsVariablesWinOverTorchruns) {
  // weft run sets both its own and torchrun's variables.
  set({{"WEFT_RANK", "1"}, {"WEFT_WORLD_SIZE", "2"}, {"WEFT_STORE_ADDR", "127.0.0.1:4567"},
       {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"SLURM_PROCID", "0"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.launcher, "weft run");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.store_port, 4567);
  EXPECT_EQ(e.store_prefix, "");
}

// weft run on several nodes: global rank, local rank and the epoch's store prefix.
TEST_F(LaunchEnvTest, WeftRunOnSeveralNodesGivesTheEpochsStorePrefix) {
  set({{"WEFT_RANK", "3"}, {"WEFT_LOCAL_RANK", "1"}, {"WEFT_WORLD_SIZE", "4"},
       {"WEFT_STORE_ADDR", "node01:29400"}, {"WEFT_STORE_PREFIX", "rdzv/job7/epoch/1"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.store_host, "node01");
  EXPECT_EQ(e.store_prefix, "rdzv/job7/epoch/1");
}

}  // namespace
}  // namespace weft::parallel
