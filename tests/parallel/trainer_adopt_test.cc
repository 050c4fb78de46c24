// The trainer's side of an online resize: a StateInit::kDeferred trainer allocates no state
// until adopt_state() moves a rank's state tensors in (what the router's run_transition
// returns), and then trains bit for bit like the trainer the state came from; a step whose
// collectives fail says through torn() whether this rank already changed its state.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <optional>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "comm/registry.h"
#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"
#include "memory/allocator.h"
#include "parallel/trainer.h"
#include "parallel/vps.h"
#include "tests/parallel/layout_harness.h"
#include "tests/parallel/trainer_data.h"
#include "tests/support/bitwise.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

using parallel::ParallelTrainer;
using parallel::RankLayout;
using parallel::StateInit;
using parallel::StateKind;
using parallel::StateSpace;

const std::vector<std::string> kLossFree = {
    "model.moe.balance=loss_free", "model.moe.bias_update_rate=0.05", "train.warmup_steps=2"};

StateSpace space_of(ParallelTrainer& t) {
  return StateSpace::from_graph(t.graph(), t.moe_balance());
}

RankLayout layout_of(ParallelTrainer& t) {
  return parallel::layout_of(space_of(t), t.plan(), t.rank());
}

std::vector<core::Tensor> clones(const std::vector<core::Tensor>& v) {
  std::vector<core::Tensor> out;
  for (const core::Tensor& t : v) out.push_back(t.clone());
  return out;
}

// Every state tensor of `a` and `b` equal bit for bit (same layout).
void expect_same_state(const StateSpace& space, const RankLayout& layout,
                       const std::vector<core::Tensor>& a, const std::vector<core::Tensor>& b) {
  ASSERT_EQ(a.size(), layout.locals.size());
  ASSERT_EQ(b.size(), layout.locals.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(same_bits(a[i], b[i])) << space.at(layout.locals[i].state).name;
}

// A resize on the same layout: trainer R runs 6 steps (the reference); trainer X runs 3,
// keeps only views of its state (state_tensors) and is destroyed; trainer Y, built
// kDeferred, adopts those views and runs steps 3..5, whose statistics and final state must
// equal R's bit for bit.
void expect_round_trip(const std::string& config, int world, std::vector<std::string> sets) {
  core::JobSpec spec = trainer_spec(config, sets);
  TrainData data(spec);
  const core::BatchFn batch = data.batch();
  // Odd: on this data loss_free's bias steps flip every step, so after an even number of
  // steps it is back within rounding of zero and a lost bias would go unnoticed.
  constexpr int kBefore = 3, kAfter = 3;
  const RunOptions ro = trainer_run_options();
  RunResult r = run_ranks(
      world,
      [&](RankContext& ctx) {
        std::vector<core::StepStats> ref;
        std::vector<core::Tensor> ref_state;  // R's state after its last step
        {
          RankWorld w = gloo_world(ctx, "r", std::chrono::milliseconds(30'000));
          ParallelTrainer t(spec, *w.comm);
          for (int s = 0; s < kBefore + kAfter; ++s) ref.push_back(t.step(batch));
          ref_state = clones(t.state_tensors(space_of(t), layout_of(t)));
        }
        ASSERT_NE(ref.front().loss, ref.back().loss) << "the run must train";
        std::vector<core::Tensor> kept;
        StateSpace space;
        RankLayout mine;
        {
          RankWorld w = gloo_world(ctx, "x", std::chrono::milliseconds(30'000));
          ParallelTrainer x(spec, *w.comm);
          for (int s = 0; s < kBefore; ++s) expect_same_stats(x.step(batch), ref[size_t(s)]);
          space = space_of(x);
          mine = layout_of(x);
          kept = x.state_tensors(space, mine);
        }
        RankWorld w = gloo_world(ctx, "y", std::chrono::milliseconds(30'000));
        ParallelTrainer y(spec, *w.comm, StateInit::kDeferred);
        const StateSpace y_space = space_of(y);
        const RankLayout y_mine = layout_of(y);
        ASSERT_EQ(y_space.size(), space.size());
        ASSERT_EQ(y_mine.locals.size(), mine.locals.size());
        int buffers = 0;
        std::vector<const void*> storage;  // the kept tensors' data, to check no copy was made
        for (size_t i = 0; i < kept.size(); ++i) {
          storage.push_back(kept[i].raw_data());
          if (space.at(mine.locals[i].state).kind == StateKind::kBuffer) ++buffers;
        }
        if (spec.model.moe.balance == "loss_free") {
          EXPECT_GT(buffers, 0);
        }
        y.adopt_state(y_space, y_mine, kept);
        EXPECT_TRUE(kept.empty());
        EXPECT_EQ(y.current_step(), kBefore);
        EXPECT_FALSE(y.torn());
        parallel::TensorTable& table = y.executor().tensors();
        for (size_t i = 0; i < y_mine.locals.size(); ++i) {
          const int pt = y_mine.locals[i].plan_tensor;
          if (pt < 0) continue;
          EXPECT_EQ(table.read(pt).raw_data(), storage[i])
              << y_space.at(y_mine.locals[i].state).name << " was copied, not moved in";
        }
        for (int s = 0; s < kAfter; ++s) {
          core::StepStats st = y.step(batch);
          expect_same_stats(st, ref[size_t(kBefore + s)]);
        }
        EXPECT_EQ(y.current_step(), kBefore + kAfter);
        // Every state tensor, the routing bias included, as R's bit for bit.
        expect_same_state(y_space, y_mine, y.state_tensors(y_space, y_mine), ref_state);
      },
      ro);
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST(TrainerAdopt, RoundTripOneRank) { expect_round_trip("gpt-layout.yaml", 1, {}); }

TEST(TrainerAdopt, RoundTripDp2Zero1) {
  expect_round_trip("gpt-layout.yaml", 2, {"parallel.dp=2", "parallel.zero=1"});
}

// The loss-free routing bias (a kBuffer state, outside the executor) moves with the rest:
// at a bias step of 0.05 the top-2 choice moves within a few steps, so a bias left at zero
// would change the losses.
TEST(TrainerAdopt, RoundTripMoeLossFreeDp2) {
  std::vector<std::string> sets = kLossFree;
  sets.push_back("parallel.dp=2");
  expect_round_trip("moe-layout.yaml", 2, sets);
}

// kDeferred allocates none of the state: its roots are undefined, and the host allocator
// holds exactly the state's bytes less than under kUnseeded. Until adopt_state, a step and
// state_tensors() refuse; adopt_state checks each tensor before it changes anything.
TEST(TrainerAdopt, DeferredAllocatesNoStateUntilAdopted) {
  core::JobSpec spec = trainer_spec("gpt-layout.yaml", {});
  TrainData data(spec);
  const core::BatchFn batch = data.batch();
  RunResult r = run_ranks(1, [&](RankContext&) {
    comm::CommOptions o;
    o.rank = 0, o.size = 1;
    auto world = comm::make_communicator(comm::BackendKind::kLoopback, o);
    memory::Allocator& host = memory::default_host_allocator();
    int64_t unseeded_bytes = 0;
    {
      const size_t before = host.stats().bytes_live;
      ParallelTrainer u(spec, *world, StateInit::kUnseeded);
      unseeded_bytes = int64_t(host.stats().bytes_live) - int64_t(before);
    }
    const size_t before = host.stats().bytes_live;
    ParallelTrainer d(spec, *world, StateInit::kDeferred);
    const int64_t deferred_bytes = int64_t(host.stats().bytes_live) - int64_t(before);
    const StateSpace space = space_of(d);
    const RankLayout mine = layout_of(d);
    int64_t state_bytes = 0;
    parallel::TensorTable& table = d.executor().tensors();
    int roots = 0;
    for (size_t i = 0; i < table.size(); ++i) {
      const planner::TensorDesc& desc = table.desc(int(i));
      if (table.state_root(int(i))) {
        ++roots;
        EXPECT_FALSE(table.slot(int(i)).defined()) << table.name(int(i));
      } else if (desc.persistent && desc.alias_of < 0) {
        EXPECT_TRUE(table.slot(int(i)).defined()) << table.name(int(i)) << " (not state)";
      }
    }
    for (const parallel::LocalTensor& l : mine.locals)
      if (l.plan_tensor >= 0) {
        EXPECT_TRUE(table.state_root(l.plan_tensor));
        state_bytes += l.bytes();
        --roots;
      }
    EXPECT_EQ(roots, 0) << "the state roots are the layout's plan tensors";
    EXPECT_GT(state_bytes, 0);
    EXPECT_EQ(unseeded_bytes - deferred_bytes, state_bytes);

    auto expect_unprovided = [&](const std::function<void()>& f, const char* what) {
      try {
        f();
        ADD_FAILURE() << what << " ran on a kDeferred trainer before adopt_state";
      } catch (const InternalError& e) {
        EXPECT_NE(std::string(e.what()).find("never provided"), std::string::npos) << e.what();
      }
    };
    expect_unprovided([&] { d.step(batch); }, "step");
    expect_unprovided([&] { d.state_tensors(space, mine); }, "state_tensors");
    EXPECT_EQ(d.current_step(), 0);
    EXPECT_FALSE(d.torn());

    // The state to adopt: parameters 0.25, moments zero, step 3, the job's seed.
    auto fresh = [&] {
      std::vector<core::Tensor> v = parallel::allocate_locals(mine);
      for (size_t i = 0; i < v.size(); ++i) {
        const parallel::StateTensor& st = space.at(mine.locals[i].state);
        if (st.kind == StateKind::kParameter) v[i].fill_(0.25);
        if (st.name == parallel::kSeedState) v[i].data<int64_t>()[0] = int64_t(spec.train.seed);
        if (st.name == parallel::kStepState || st.name == parallel::kDataCursorState)
          v[i].data<int64_t>()[0] = 3;
      }
      return v;
    };
    auto expect_refused = [&](std::vector<core::Tensor> v, const std::string& names) {
      try {
        d.adopt_state(space, mine, v);
        ADD_FAILURE() << "adopt_state took a bad state (" << names << ")";
      } catch (const InternalError& e) {
        EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
      }
      EXPECT_EQ(v.size(), mine.locals.size()) << "a refused state is left to the caller";
      for (size_t i = 0; i < table.size(); ++i)
        if (table.state_root(int(i))) {
          EXPECT_FALSE(table.slot(int(i)).defined()) << table.name(int(i));
        }
    };
    {
      std::vector<core::Tensor> v = fresh();
      v[1] = core::Tensor::zeros({1}, mine.locals[1].dtype);
      expect_refused(std::move(v), space.at(mine.locals[1].state).name);
    }
    {
      std::vector<core::Tensor> v = fresh();
      v[0] = v[0].to(core::DType::kF64);
      expect_refused(std::move(v), space.at(mine.locals[0].state).name);
    }
    {
      std::vector<core::Tensor> v = fresh();
      for (size_t i = 0; i < v.size(); ++i)
        if (space.at(mine.locals[i].state).name == parallel::kSeedState)
          v[i].data<int64_t>()[0] += 1;
      expect_refused(std::move(v), "seed");
    }
    expect_unprovided([&] { d.step(batch); }, "step after a refused adopt_state");

    std::vector<core::Tensor> v = fresh();
    d.adopt_state(space, mine, v);
    EXPECT_TRUE(v.empty());
    EXPECT_EQ(d.current_step(), 3);
    for (size_t i = 0; i < table.size(); ++i)
      if (table.state_root(int(i))) {
        EXPECT_TRUE(table.slot(int(i)).defined()) << table.name(int(i));
      }
    std::vector<core::Tensor> now = d.state_tensors(space, mine);
    for (size_t i = 0; i < now.size(); ++i) {
      const parallel::StateTensor& st = space.at(mine.locals[i].state);
      if (st.kind == StateKind::kParameter) {
        EXPECT_EQ(now[i].item(), 0.25) << st.name;
      } else if (st.kind == StateKind::kAdamM || st.kind == StateKind::kAdamV) {
        EXPECT_EQ(now[i].item(), 0.0) << st.name;
      }
    }
    core::StepStats st = d.step(batch);
    EXPECT_EQ(st.step, 3);
    EXPECT_TRUE(st.applied);
    EXPECT_EQ(d.current_step(), 4);
  });
  EXPECT_TRUE(r.ok()) << r.summary();
}

// The world communicator of a rank with a hook run once, at the next all_reduce after
// arm(). Under data parallelism alone the world also serves the process group of all ranks
// (ProcessGroups), so the gradient collectives pass here too: armed from the trainer's
// before_update (after every gradient collective and the norm, right before the first
// adamw), the next all_reduce of a dp2 loss_free step is the bias update at the end of
// RankExecutor::run_step, after every adamw of the step.
class HookedWorld : public comm::Communicator {
 public:
  explicit HookedWorld(comm::Communicator& c) : c_(c) {}
  void arm(std::function<void()> hook) { hook_ = std::move(hook); }

  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  comm::BackendKind backend() const override { return c_.backend(); }
  comm::Millis timeout() const override { return c_.timeout(); }
  comm::Work all_reduce(const core::Tensor& t, const comm::AllReduceOptions& o) override {
    if (hook_) std::exchange(hook_, nullptr)();
    return c_.all_reduce(t, o);
  }
  comm::Work reduce_scatter(const core::Tensor& out, const core::Tensor& in,
                            const comm::ReduceScatterOptions& o) override {
    return c_.reduce_scatter(out, in, o);
  }
  comm::Work all_gather(const core::Tensor& out, const core::Tensor& in,
                        const comm::AllGatherOptions& o) override {
    return c_.all_gather(out, in, o);
  }
  comm::Work broadcast(const core::Tensor& t, const comm::BroadcastOptions& o) override {
    return c_.broadcast(t, o);
  }
  comm::Work all_to_all_v(const core::Tensor& out, const std::vector<int64_t>& out_counts,
                          const core::Tensor& in, const std::vector<int64_t>& in_counts,
                          const comm::AllToAllOptions& o) override {
    return c_.all_to_all_v(out, out_counts, in, in_counts, o);
  }
  comm::Work send(const core::Tensor& t, int peer, const comm::SendOptions& o) override {
    return c_.send(t, peer, o);
  }
  comm::Work recv(const core::Tensor& t, int peer, const comm::RecvOptions& o) override {
    return c_.recv(t, peer, o);
  }
  comm::Work barrier(const comm::BarrierOptions& o) override { return c_.barrier(o); }
  std::unique_ptr<comm::Communicator> split(int color, int key,
                                            const comm::SplitOptions& o) override {
    return c_.split(color, key, o);
  }
  void abort(const std::string& reason) noexcept override { c_.abort(reason); }
  bool aborted() const override { return c_.aborted(); }

 private:
  comm::Communicator& c_;
  std::function<void()> hook_;
};

enum class KillAt {
  kForward,    // rank 1 dies loading its first micro-batch of the step
  kAfterStep,  // rank 1 dies once rank 0 ran the whole step program but the bias update
};

// Two ranks train 2 steps; in step 2 rank 1 is SIGKILLed at `at`. Rank 0's step must throw
// a CommError, leave current_step() at 2, and report torn() as `torn`; when not torn, its
// state is bit for bit that of step 2.
void expect_torn(const std::string& config, std::vector<std::string> sets, KillAt at, bool torn) {
  core::JobSpec spec = trainer_spec(config, sets);
  TrainData data(spec);
  constexpr int64_t kDieAt = 2;
  // One process's statistics of the step the peer dies in: what a torn rank that got
  // through the step's statistics exchange keeps (exchanged_stats).
  core::StepStats ref;
  {
    core::JobSpec single = spec;
    single.parallel = core::ParallelSpec();
    core::Trainer t(single);
    core::BatchFn b = data.batch();
    for (int64_t s = 0; s <= kDieAt; ++s) ref = t.step(b);
  }
  const RunOptions ro = trainer_run_options();
  RunResult r = run_ranks(
      2,
      [&](RankContext& ctx) {
        const int rank = ctx.rank();
        RankWorld w = gloo_world(ctx, "torn", std::chrono::milliseconds(20'000));
        HookedWorld world(*w.comm);
        std::unique_ptr<comm::Store> store = ctx.store();
        core::BatchFn batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
          if (at == KillAt::kForward && rank == 1 && s == kDieAt) ::kill(::getpid(), SIGKILL);
          data.set.fill_train(s, b0, n, x, y);
        };
        ParallelTrainer t(spec, world);
        for (int64_t s = 0; s < kDieAt; ++s) ASSERT_TRUE(t.step(batch).applied);
        const StateSpace space = space_of(t);
        const RankLayout mine = layout_of(t);
        const std::vector<core::Tensor> before = clones(t.state_tensors(space, mine));
        bool armed = false;
        if (at == KillAt::kAfterStep)
          t.set_before_update([&] {
            if (std::exchange(armed, true)) return;  // this step's only
            if (rank == 0)
              world.arm([&] { store->set("rank0.bias_update", comm::Bytes{1}); });
            else
              world.arm([&] {
                store->wait({"rank0.bias_update"}, std::chrono::milliseconds(60'000));
                ::kill(::getpid(), SIGKILL);
              });
          });
        try {
          t.step(batch);
          ADD_FAILURE() << "rank " << rank << ": step " << kDieAt << " survived its peer's death";
        } catch (const CommError& e) {
          std::printf("[torn] rank %d: %s\n", rank, e.what());
        }
        EXPECT_EQ(t.torn(), torn);
        EXPECT_EQ(t.executor().state_written(), torn);
        EXPECT_EQ(t.current_step(), kDieAt);
        if (!torn) expect_same_state(space, mine, t.state_tensors(space, mine), before);
        // Past the exchange (the peer dies at the update), the step's statistics are kept
        // for its metrics line; before it, none are.
        const std::optional<core::StepStats>& kept = t.exchanged_stats();
        if (at == KillAt::kAfterStep) {
          ASSERT_TRUE(kept.has_value());
          EXPECT_EQ(kept->step, kDieAt);
          EXPECT_NEAR(kept->loss, ref.loss, 1e-5 * std::fabs(ref.loss));
          EXPECT_NEAR(kept->grad_norm, ref.grad_norm, 1e-5 * std::fabs(ref.grad_norm));
          EXPECT_TRUE(kept->applied);
        } else {
          EXPECT_FALSE(kept.has_value());
        }
      },
      ro);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_TRUE(r.ranks[0].ok()) << r.summary();
  EXPECT_EQ(r.ranks[1].status, RankStatus::kSignaled) << r.summary();
  EXPECT_EQ(r.ranks[1].signal, SIGKILL) << r.summary();
}

// A lost member aborts the world (the LossWatcher, launch/live_resize.h) while a rank
// computes: the rank stops its step at the next instruction, not at its next collective,
// which here comes only after both micro-batches' forward and backward. Rank 0 aborts its own
// world while loading its first micro-batch of step 2: it loads no second one, its state is
// that of step 2 and untorn, and rank 1, released by the abort, fails its step the same way.
TEST(TrainerTorn, AnAbortedWorldStopsTheStepAtTheNextInstruction) {
  core::JobSpec spec = trainer_spec("gpt-layout.yaml", {"parallel.dp=2", "parallel.zero=1"});
  TrainData data(spec);
  constexpr int64_t kAbortAt = 2;
  const RunOptions ro = trainer_run_options();
  RunResult r = run_ranks(
      2,
      [&](RankContext& ctx) {
        const int rank = ctx.rank();
        RankWorld w = gloo_world(ctx, "abort", std::chrono::milliseconds(20'000));
        int loads = 0;
        core::BatchFn batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
          if (s == kAbortAt) {
            ++loads;
            if (rank == 0) w.comm->abort("a member was lost (test)");
          }
          data.set.fill_train(s, b0, n, x, y);
        };
        ParallelTrainer t(spec, *w.comm);
        for (int64_t s = 0; s < kAbortAt; ++s) ASSERT_TRUE(t.step(batch).applied);
        const StateSpace space = space_of(t);
        const RankLayout mine = layout_of(t);
        const std::vector<core::Tensor> before = clones(t.state_tensors(space, mine));
        try {
          t.step(batch);
          ADD_FAILURE() << "rank " << rank << ": step " << kAbortAt << " survived the abort";
        } catch (const CommError& e) {
          std::printf("[abort] rank %d: %s\n", rank, e.what());
          if (rank == 0) {
            EXPECT_NE(std::string(e.what()).find("rank 0 stopped its step before instruction"),
                      std::string::npos)
                << e.what();
          }
        }
        if (rank == 0) {
          EXPECT_EQ(loads, 1);  // 2 micro-batches a rank; the abort came in the first
        }
        EXPECT_FALSE(t.torn());
        EXPECT_FALSE(t.executor().state_written());
        EXPECT_EQ(t.current_step(), kAbortAt);
        expect_same_state(space, mine, t.state_tensors(space, mine), before);
      },
      ro);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_TRUE(r.ranks[0].ok()) << r.summary();
  EXPECT_TRUE(r.ranks[1].ok()) << r.summary();
}

TEST(TrainerTorn, PeerLostInTheForwardLeavesTheStateOfTheStepDp2Zero1) {
  expect_torn("gpt-layout.yaml", {"parallel.dp=2", "parallel.zero=1"}, KillAt::kForward, false);
}

TEST(TrainerTorn, PeerLostInTheForwardLeavesTheBiasOfTheStepMoeLossFree) {
  std::vector<std::string> sets = kLossFree;
  sets.push_back("parallel.dp=2");
  expect_torn("moe-layout.yaml", sets, KillAt::kForward, false);
}

TEST(TrainerTorn, PeerLostAfterTheUpdateIsTorn) {
  std::vector<std::string> sets = kLossFree;
  sets.push_back("parallel.dp=2");
  expect_torn("moe-layout.yaml", sets, KillAt::kAfterStep, true);
}

}  // namespace
}  // namespace weft::test
