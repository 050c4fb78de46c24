// The Gloo backend with real processes (run_ranks forks the ranks around a TCP store): every
// collective on every dtype for worlds of 1 to 4, sub-groups used concurrently, two epochs'
// communicators alive at once, and a threads-in-one-process run on the in-memory store.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "comm/gloo/thread_slice.h"
#include "comm/registry.h"
#include "comm/store/in_memory_store.h"
#include "tests/comm/comm_test_util.h"
#include "tests/support/multiprocess.h"

#if WEFT_HAVE_GLOO

namespace weft::comm {
namespace {

using namespace std::chrono_literals;
using core::DType;
using core::Tensor;
using testing::run_collective_suite;

std::unique_ptr<Communicator> make_gloo(test::RankContext& ctx, Store& store,
                                        const std::string& prefix, Millis timeout = 20s) {
  CommOptions o;
  o.rank = ctx.rank();
  o.size = ctx.world();
  o.store = &store;
  o.prefix = prefix;
  o.timeout = timeout;
  return make_communicator(BackendKind::kGloo, o);
}

class GlooWorld : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorld, EveryCollectiveOnEveryDtypeMatchesTheReference) {
  const int world = GetParam();
  test::RunResult result = test::run_ranks(world, [](test::RankContext& ctx) {
    auto store = ctx.store();
    auto comm = make_gloo(ctx, *store, "suite");
    ASSERT_EQ(comm->rank(), ctx.rank());
    ASSERT_EQ(comm->size(), ctx.world());
    ASSERT_EQ(comm->backend(), BackendKind::kGloo);
    run_collective_suite(*comm);
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooWorld, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// 64 MiB of f32 per rank: the ring path (segmented, many messages) rather than bcube.
TEST(Gloo, LargeAllReduceAndAllGather) {
  test::RunResult result = test::run_ranks(3, [](test::RankContext& ctx) {
    auto store = ctx.store();
    auto comm = make_gloo(ctx, *store, "large", 60s);
    const int64_t n = int64_t(16) << 20;
    Tensor t = Tensor::empty({n}, DType::kF32);
    float* p = t.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = float((i + ctx.rank()) % 1000);
    comm->all_reduce(t, {.op = ReduceOp::kSum}).wait();
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < ctx.world(); ++r) want += float((i + r) % 1000);
      ASSERT_EQ(p[i], want) << "element " << i;
    }
    Tensor part = Tensor::empty({n / 4}, DType::kF32);
    part.fill_(double(ctx.rank() + 1));
    Tensor all = Tensor::empty({n / 4 * ctx.world()}, DType::kF32);
    comm->all_gather(all, part).wait();
    for (int r = 0; r < ctx.world(); ++r) {
      ASSERT_EQ(all.item_at(r * (n / 4)), double(r + 1));
      ASSERT_EQ(all.item_at((r + 1) * (n / 4) - 1), double(r + 1));
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

// Colours by parity, keys reversing the order; each sub-group runs collectives from one
// thread while another thread of the same rank runs collectives on the parent.
// Point-to-point waits run on kept threads, one per transfer in flight: many sends posted
// before any receive and received in the reverse order all complete with their own data,
// and a second round runs on the threads the first one left.
TEST(Gloo, ManyTransfersInFlightCompleteInAnyOrder) {
  test::RunResult result = test::run_ranks(2, [](test::RankContext& ctx) {
    auto store = ctx.store();
    auto comm = make_gloo(ctx, *store, "inflight");
    constexpr int kMessages = 48;
    for (int round = 0; round < 2; ++round) {
      std::vector<Tensor> bufs;
      std::vector<Work> works;
      if (ctx.rank() == 0) {
        for (int m = 0; m < kMessages; ++m) {
          bufs.push_back(Tensor::empty({16}, DType::kF32));
          bufs.back().fill_(double(round * 1000 + m));
          works.push_back(comm->send(bufs.back(), 1, {.tag = m}));
        }
        // The receiver takes them last first: the early sends stay in flight meanwhile.
        for (int m = kMessages - 1; m >= 0; --m) works[size_t(m)].wait();
      } else {
        for (int m = kMessages - 1; m >= 0; --m) {
          Tensor t = Tensor::zeros({16}, DType::kF32);
          comm->recv(t, 0, {.tag = m}).wait();
          ASSERT_EQ(t.item_at(15), double(round * 1000 + m)) << "message " << m;
        }
      }
      comm->barrier().wait();
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

TEST(Gloo, SplitSubGroupsRunConcurrentlyWithTheParent) {
  test::RunResult result = test::run_ranks(4, [](test::RankContext& ctx) {
    auto store = ctx.store();
    auto comm = make_gloo(ctx, *store, "split");
    const int me = ctx.rank();
    std::unique_ptr<Communicator> sub = comm->split(me % 2, -me);
    ASSERT_NE(sub, nullptr);
    ASSERT_EQ(sub->size(), 2);
    // colour 0 = {0, 2}, keys {0, -2}: rank 2 first. Colour 1 = {1, 3}: rank 3 first.
    ASSERT_EQ(sub->rank(), me < 2 ? 1 : 0);

    std::thread parent_thread([&] {
      for (int iter = 0; iter < 20; ++iter) {
        Tensor t = Tensor::from_vector<int64_t>({2}, {me, iter});
        comm->all_reduce(t).wait();
        EXPECT_EQ(t.item_at(0), 0 + 1 + 2 + 3);
        EXPECT_EQ(t.item_at(1), 4 * iter);
      }
    });
    for (int iter = 0; iter < 20; ++iter) {
      Tensor t = Tensor::from_vector<int64_t>({1}, {me});
      sub->all_reduce(t).wait();
      EXPECT_EQ(t.item_at(0), me % 2 == 0 ? 0 + 2 : 1 + 3);
      Tensor gathered = Tensor::empty({2}, DType::kI64);
      sub->all_gather(gathered, Tensor::from_vector<int64_t>({1}, {me})).wait();
      // new-rank order: the higher old rank first
      EXPECT_EQ(gathered.item_at(0), me % 2 == 0 ? 2 : 3);
      EXPECT_EQ(gathered.item_at(1), me % 2 == 0 ? 0 : 1);
    }
    parent_thread.join();

    // A rank without a colour gets no communicator; the others get a group of three.
    std::unique_ptr<Communicator> three = comm->split(me == 3 ? kNoColor : 7, me);
    if (me == 3) {
      EXPECT_EQ(three, nullptr);
    } else {
      ASSERT_NE(three, nullptr);
      EXPECT_EQ(three->size(), 3);
      EXPECT_EQ(three->rank(), me);
      run_collective_suite(*three, /*with_self_p2p=*/false);
    }
    // The parent survives its children.
    sub.reset();
    three.reset();
    comm->barrier().wait();
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

// A resize: the old world (4 ranks, epoch 0) keeps working while the new one (3 ranks,
// epoch 1) is built and used, from two threads at once; then the old one goes away.
TEST(Gloo, OldAndNewEpochCommunicatorsLiveSideBySide) {
  test::RunResult result = test::run_ranks(4, [](test::RankContext& ctx) {
    auto store = ctx.store();
    auto old_world = make_gloo(ctx, *store, "epoch/0");
    const int me = ctx.rank();
    std::unique_ptr<Communicator> new_world;
    std::thread old_thread([&] {
      for (int iter = 0; iter < 10; ++iter) {
        Tensor t = Tensor::from_vector<float>({1}, {float(me)});
        old_world->all_reduce(t, {.op = ReduceOp::kMax}).wait();
        EXPECT_EQ(t.item_at(0), 3.0);
      }
    });
    if (me < 3) {
      CommOptions o;
      o.rank = me;
      o.size = 3;
      o.store = store.get();
      o.prefix = "epoch/1";
      o.timeout = 20s;
      new_world = make_communicator(BackendKind::kGloo, o);
      for (int iter = 0; iter < 10; ++iter) {
        Tensor t = Tensor::from_vector<float>({1}, {float(me + 1)});
        new_world->all_reduce(t).wait();
        EXPECT_EQ(t.item_at(0), 1.0 + 2.0 + 3.0);
      }
    }
    old_thread.join();
    old_world->barrier().wait();
    old_world.reset();
    if (new_world) {
      Tensor t = Tensor::from_vector<int32_t>({1}, {me == 0 ? 42 : 0});
      new_world->broadcast(t, {.root = 0}).wait();
      EXPECT_EQ(t.item_at(0), 42);
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

// Ranks as threads of one process on the in-memory store: the same suite, and proof that
// several Gloo contexts coexist in one process.
// thread_slice.h: the rank's thread that builds a communicator of two, and every thread the
// communicator starts (the transport's event loop, the worker, the point-to-point waiters),
// run with the short slice; a world of one starts no transport and changes nothing.
TEST(Gloo, EveryThreadOfAMultiRankCommunicatorRunsWithTheShortSlice) {
  // Asked on a thread of its own: the ranks fork from this one and must start at the default.
  bool supported = false;
  std::thread probe([&] { supported = set_thread_slice(kCommThreadSlice); });
  probe.join();
  if (!supported)
    GTEST_SKIP() << "this kernel keeps the default slice (custom slices need Linux 6.12)";
  auto tasks = [] {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
      out.insert(e.path().filename().string());
    return out;
  };
  test::RunResult result = test::run_ranks(2, [&](test::RankContext& ctx) {
    ASSERT_NE(thread_slice(), std::chrono::nanoseconds(kCommThreadSlice))
        << "the default to start from";
    auto store = ctx.store();
    const std::set<std::string> before = tasks();  // the store's client threads are not ours
    auto comm = make_gloo(ctx, *store, "slice");
    Tensor t = Tensor::zeros({4}, DType::kF32);
    if (ctx.rank() == 0)
      comm->send(t, 1, {.tag = 7}).wait();
    else
      comm->recv(t, 0, {.tag = 7}).wait();
    comm->all_reduce(t).wait();
    EXPECT_EQ(thread_slice(), std::chrono::nanoseconds(kCommThreadSlice));
    int started = 0;
    for (const std::string& tid : tasks()) {
      if (before.count(tid)) continue;
      ++started;
      EXPECT_EQ(thread_slice(pid_t(std::stoi(tid))), std::chrono::nanoseconds(kCommThreadSlice))
          << "thread " << tid;
    }
    EXPECT_GE(started, 3) << "the event loop, the worker and a waiter";
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

TEST(Gloo, ThreadsInOneProcessOnTheInMemoryStore) {
  constexpr int kWorld = 3;
  InMemoryStore store(20s);
  std::vector<std::thread> threads;
  std::atomic<int> finished{0};
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      CommOptions o;
      o.rank = r;
      o.size = kWorld;
      o.store = &store;
      o.prefix = "threads";
      o.timeout = 20s;
      auto comm = make_communicator(BackendKind::kGloo, o);
      run_collective_suite(*comm);
      finished.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(finished.load(), kWorld);
}

}  // namespace
}  // namespace weft::comm

#else

TEST(Gloo, NotBuilt) { GTEST_SKIP() << "Gloo not found at configure time (WEFT_WITH_GLOO)"; }

#endif
