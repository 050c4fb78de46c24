// Where a rank's communication buffers come from: the buffers a collective packs its pieces
// into and a pipeline receive lands in are allocated from the step's activation arena
// (memory.allocator), so step 0's allocation trace has them and the planned allocator plans
// them with the activations. From the host allocator, a buffer above glibc's mmap threshold
// was mapped anew and faulted in at every call: a dp2 ZeRO-3 step of 8 x 768 faulted
// 30-110k pages, 1.3k after this change.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "memory/trace.h"
#include "parallel/trainer.h"
#include "tests/parallel/trainer_data.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

using planner::CollKind;
using planner::InstrKind;

// Trains two steps of `sets` on `world` ranks with step 0's trace saved, and expects every
// communication buffer the rank's program names (`wanted`: a collective of those kinds by
// its buffer's bytes, a receive by its message's) among the trace's kComm allocations.
void expect_buffers_in_the_arena(int world, const std::vector<std::string>& sets,
                                 const std::vector<CollKind>& kinds, bool receives) {
  const core::JobSpec spec = trainer_spec("gpt-layout.yaml", sets);
  TrainData data(spec);
  const core::BatchFn batch = data.batch();
  namespace fs = std::filesystem;
  struct Folder {  // removed however the test ends
    fs::path path = fs::temp_directory_path() / ("weft_staging_" + std::to_string(::getpid()));
    Folder() { fs::create_directories(path); }
    ~Folder() { fs::remove_all(path); }
  } dir;
  RunResult r = run_ranks(
      world,
      [&](RankContext& ctx) {
        const std::string trace = (dir.path / ("trace-" + std::to_string(ctx.rank()))).string();
        ::setenv("WEFT_MEMORY_TRACE", trace.c_str(), 1);
        RankWorld w = gloo_world(ctx, "staging", std::chrono::milliseconds(60'000));
        parallel::ParallelTrainer t(spec, *w.comm);
        t.step(batch);
        t.step(batch);                        // its begin_step saves step 0's trace
        std::map<uint64_t, int> comm_blocks;  // bytes -> allocations
        for (const memory::TraceRecord& rec : memory::load_trace(trace).records)
          if (rec.tag == memory::Tag::kComm) ++comm_blocks[rec.size];
        int wanted = 0;
        for (const planner::Instr& in : t.executor().program().program) {
          const bool coll = in.kind == InstrKind::kCollective &&
                            std::find(kinds.begin(), kinds.end(), in.coll) != kinds.end();
          const bool recv = receives && in.kind == InstrKind::kRecv;
          if (!coll && !recv) continue;
          ++wanted;
          auto it = comm_blocks.find(uint64_t(in.bytes));
          ASSERT_TRUE(it != comm_blocks.end() && it->second > 0)
              << "rank " << ctx.rank() << ": no arena allocation of " << in.bytes
              << " bytes for the " << (recv ? "receive" : "collective") << " at program position "
              << (&in - t.executor().program().program.data());
          --it->second;  // one per instruction: each packs into a buffer of its own
        }
        EXPECT_GT(wanted, 0) << "the layout has no such instruction: the test checks nothing";
      },
      trainer_run_options());
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST(CollectiveStaging, Zero3GathersAndReduceScattersPackIntoTheActivationArena) {
  expect_buffers_in_the_arena(2, {"parallel.dp=2", "parallel.zero=3"},
                              {CollKind::kAllGather, CollKind::kReduceScatter}, false);
}

TEST(CollectiveStaging, PipelineReceivesLandInTheActivationArena) {
  expect_buffers_in_the_arena(2, {"parallel.pp=2"}, {}, true);
}

}  // namespace
}  // namespace weft::test
