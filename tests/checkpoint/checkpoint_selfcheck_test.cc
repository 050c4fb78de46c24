// Checkpoints that verify themselves, in the library: a NaN is never saved (sync, async,
// several ranks, none hangs); two jobs saving into one root never mix shards; version-1
// metadata is refused with a clear message; temporary folders of a dead writer go, those of
// a live one stay.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <regex>

#include "checkpoint/job_id.h"
#include "checkpoint/retention.h"
#include "checkpoint/select.h"
#include "comm/registry.h"
#include "parallel/launch_env.h"
#include "planner/planner.h"
#include "tests/checkpoint/ckpt_util.h"
#include "tests/support/multiprocess.h"

namespace weft::checkpoint {
namespace {

namespace fs = std::filesystem;
using test_util::TempDir;
using test_util::tiny_job;

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void poison(core::Trainer& t, const std::string& name) {
  parallel::StateSpace space = parallel::StateSpace::from_graph(t.model().graph);
  t.executor().tensor(space.at(space.find(name)).value).data<float>()[3] = INFINITY;
}

TEST(CheckpointNonFinite, ASaveWithANaNIsRefusedNamingTheStateAndTheStep) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  spec.checkpoint.dir = dir.str();
  spec.checkpoint.keep = 5;
  for (bool async : {false, true}) {
    spec.checkpoint.async = async;
    core::Trainer t(spec);
    t.set_current_step(3);
    TrainerCheckpoints ck(spec, t);
    ck.save(true);  // a good one first: it must survive
    poison(t, "h.0.attn.qkv.weight");
    t.set_current_step(4);
    try {
      ck.save();
      ck.finish();
      ADD_FAILURE() << "saved a non-finite state (async " << async << ")";
    } catch (const NonFiniteStateError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("h.0.attn.qkv.weight"), std::string::npos) << msg;
      EXPECT_NE(msg.find("step 4"), std::string::npos) << msg;
      EXPECT_NE(msg.find("holds 1 non-finite"), std::string::npos) << msg;
    }
    EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"step-00000003"})
        << "nothing committed, no temporary folder (async " << async << ")";
  }
}

TEST(CheckpointNonFinite, OneRankWithANaNFailsEveryRankAndCommitsNothing) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  spec.parallel.dp = 2;
  core::Trainer t(spec);
  auto whole = test_util::whole_state(t);
  whole.at("h.1.mlp.fc.weight").data<float>()[7] = NAN;
  parallel::StateSpace space =
      parallel::StateSpace::from_graph(planner::build_planning_graph(spec).graph);
  planner::PlanOptions o;
  o.simulate = false;
  parallel::Layout layout = parallel::layout_of(space, planner::make_plan(spec, 2, o));
  test::RunResult result = test::run_ranks(2, [&](test::RankContext& ctx) {
    auto store = ctx.store();
    comm::CommOptions co;
    co.rank = ctx.rank(), co.size = ctx.world(), co.store = store.get(), co.prefix = "nan";
    auto comm = comm::make_communicator(comm::BackendKind::kGloo, co);
    // Replicas: only the rank that writes the box sees the NaN; the other must not hang.
    std::vector<core::Tensor> mine = test_util::slice_for(space, layout, ctx.rank(), whole);
    try {
      save_checkpoint_ranks(dir.str(), CheckpointInfo{&spec, 5, "dp2"}, space, layout, ctx.rank(),
                            mine, 2, *comm);
      ADD_FAILURE() << "rank " << ctx.rank() << " saved";
    } catch (const NonFiniteStateError& e) {
      EXPECT_NE(std::string(e.what()).find("h.1.mlp.fc.weight"), std::string::npos) << e.what();
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("another rank failed to save step 5"), std::string::npos)
          << e.what();
    }
    // Still in step with each other.
    EXPECT_FALSE(parallel::agree_stop(*comm, false));
  });
  ASSERT_TRUE(result.ok()) << result.summary();
  EXPECT_TRUE(names_in(dir.path).empty()) << "no step folder, no temporary folder";
}

// Two 2-rank jobs save steps 1..6 into one root at the same time, each with its own state;
// every folder left is whole (it verifies) and holds one job's state only.
TEST(CheckpointJobs, TwoJobsSavingIntoOneRootNeverMixShards) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  spec.parallel.dp = 2;
  core::Trainer t(spec);
  std::map<std::string, core::Tensor> state[2] = {test_util::whole_state(t),
                                                  test_util::whole_state(t)};
  for (auto& [name, x] : state[1]) x.fill_(0.25);  // job B's state differs everywhere
  parallel::StateSpace space =
      parallel::StateSpace::from_graph(planner::build_planning_graph(spec).graph);
  planner::PlanOptions o;
  o.simulate = false;
  parallel::Layout layout = parallel::layout_of(space, planner::make_plan(spec, 2, o));
  test::RunResult result = test::run_ranks(4, [&](test::RankContext& ctx) {
    const int job = ctx.rank() / 2, rank = ctx.rank() % 2;
    auto store = ctx.store();
    comm::CommOptions co;
    co.rank = rank, co.size = 2, co.store = store.get();
    co.prefix = job == 0 ? "job-a" : "job-b";
    auto comm = comm::make_communicator(comm::BackendKind::kGloo, co);
    std::vector<core::Tensor> mine = test_util::slice_for(space, layout, rank, state[job]);
    const std::string id = agree_job_id(*comm);
    for (int64_t step = 1; step <= 6; ++step)
      save_checkpoint_ranks(dir.str(), CheckpointInfo{&spec, step, "dp2", id}, space, layout, rank,
                            mine, 2, *comm);
  });
  ASSERT_TRUE(result.ok()) << result.summary();
  std::vector<std::string> kept = list_checkpoints(dir.str());
  ASSERT_GE(kept.size(), 2u);
  EXPECT_NE(kept.back().find("step-00000006"), std::string::npos);
  std::set<std::string> jobs;
  for (const std::string& step : kept) {
    Metadata m = check_checkpoint(step, "x");
    jobs.insert(m.job_id);
    core::JobSpec single = spec;
    single.parallel.dp = 0;
    core::Trainer u(single);
    parallel::StateSpace s1 = parallel::StateSpace::from_graph(u.model().graph);
    parallel::Layout whole = parallel::whole_layout(s1);
    std::vector<core::Tensor> got = parallel::allocate_locals(whole.ranks[0]);
    load_checkpoint(step, m, s1, whole, 0, got, "x");
    int matches[2] = {0, 0}, states = 0;
    for (const parallel::StateTensor& st : s1.tensors()) {
      if (st.kind == parallel::StateKind::kScalar) continue;
      ++states;
      for (int j = 0; j < 2; ++j)
        matches[j] += test_util::same_bytes(got[size_t(st.id)], state[j].at(st.name));
    }
    EXPECT_TRUE(matches[0] == states || matches[1] == states)
        << step << ": " << matches[0] << " states of job A, " << matches[1] << " of job B, of "
        << states;
  }
  EXPECT_LE(jobs.size(), 2u);
  for (const std::string& n : names_in(dir.path))
    EXPECT_EQ(n.rfind(".tmp", 0), std::string::npos) << "left behind: " << n;
}

TEST(CheckpointFormat, VersionOneMetadataIsRefusedWithAClearMessage) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  spec.checkpoint.dir = dir.str();
  spec.checkpoint.async = false;
  core::Trainer t(spec);
  const std::string step = TrainerCheckpoints(spec, t).save();
  const std::string meta = step + "/metadata.json";
  std::string text = test_util::read_file(meta);
  text = std::regex_replace(text, std::regex("weft-checkpoint/2"), "weft-checkpoint/1");
  std::ofstream(meta, std::ios::trunc) << text;
  try {
    read_metadata(step, "--resume");
    ADD_FAILURE() << "read a version-1 checkpoint";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "--resume");
    EXPECT_NE(std::string(e.what()).find("predates metadata checksums"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(meta), std::string::npos) << e.what();
  }
}

TEST(CheckpointRetention, TemporaryFoldersOfADeadWriterGoThoseOfALiveOneStay) {
  TempDir dir;
  core::JobSpec spec = tiny_job();
  spec.checkpoint.dir = dir.str();
  spec.checkpoint.async = false;
  core::Trainer t(spec);
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  auto leftover = [&](const std::string& name, pid_t owner) {
    fs::create_directories(dir.path / name);
    std::ofstream(dir.path / name / "owner") << host << " " << owner << "\n";
    std::ofstream(dir.path / name / "shard-00000.bin") << "partial";
  };
  leftover(".tmp-step-00000020-00000000000000aa", dead);        // a crashed job's
  leftover(".tmp-step-00000001-00000000000000bb", ::getpid());  // a job still writing
  t.set_current_step(2);
  TrainerCheckpoints(spec, t).save();
  EXPECT_EQ(names_in(dir.path),
            (std::vector<std::string>{".tmp-step-00000001-00000000000000bb", "step-00000002"}));
}

}  // namespace
}  // namespace weft::checkpoint
