// The MPI backend, run by CTest through mpirun (MPIEXEC_EXECUTABLE, 4 ranks, --oversubscribe):
// the reference suite on the MPI world, sub-groups used concurrently, two communicators at
// once, a peer that stops participating (timeout), abort from another thread. Outside mpirun
// every test skips with the reason (flashlight's AllReduceTest pattern).
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "base/config.h"
#include "comm/registry.h"
#include "tests/comm/comm_test_util.h"
#include "tests/support/mpi_env.h"

namespace weft::comm {
namespace {

using namespace std::chrono_literals;
using core::DType;
using core::Tensor;

#define WEFT_REQUIRE_MPIRUN()                                                              \
  do {                                                                                     \
    if (!WEFT_HAVE_MPI) GTEST_SKIP() << "MPI not found at configure time (WEFT_WITH_MPI)"; \
    if (!test::under_mpirun()) GTEST_SKIP() << test::kNotUnderMpirun;                      \
  } while (0)

std::unique_ptr<Communicator> mpi_world(Millis timeout = 20s) {
  CommOptions o;  // rank and size -1: MPI's
  o.timeout = timeout;
  return make_communicator(BackendKind::kMpi, o);
}

TEST(Mpi, EveryCollectiveOnEveryDtypeMatchesTheReference) {
  WEFT_REQUIRE_MPIRUN();
  auto comm = mpi_world();
  EXPECT_EQ(comm->rank(), test::mpirun_rank());
  EXPECT_EQ(comm->size(), test::mpirun_size());
  testing::run_collective_suite(*comm);
}

TEST(Mpi, RankAndSizeMustMatchTheMpiWorld) {
  WEFT_REQUIRE_MPIRUN();
  CommOptions o;
  o.rank = test::mpirun_rank();
  o.size = test::mpirun_size() + 1;
  EXPECT_THROW(make_communicator(BackendKind::kMpi, o), InternalError);
}

TEST(Mpi, SplitSubGroupsRunConcurrentlyWithTheParent) {
  WEFT_REQUIRE_MPIRUN();
  auto comm = mpi_world();
  const int me = comm->rank(), world = comm->size();
  auto sub = comm->split(me % 2, -me);
  ASSERT_NE(sub, nullptr);
  const int members = (world + 1 - me % 2) / 2;
  ASSERT_EQ(sub->size(), members);
  std::thread parent_thread([&] {
    for (int iter = 0; iter < 20; ++iter) {
      Tensor t = Tensor::from_vector<int64_t>({1}, {me});
      comm->all_reduce(t).wait();
      EXPECT_EQ(t.item_at(0), world * (world - 1) / 2);
    }
  });
  int64_t colour_sum = 0;
  for (int r = me % 2; r < world; r += 2) colour_sum += r;
  for (int iter = 0; iter < 20; ++iter) {
    Tensor t = Tensor::from_vector<int64_t>({1}, {me});
    sub->all_reduce(t).wait();
    EXPECT_EQ(t.item_at(0), colour_sum);
  }
  parent_thread.join();
  // keys -rank: the highest old rank of each colour becomes new rank 0
  Tensor first = Tensor::from_vector<int32_t>({1}, {me});
  sub->broadcast(first, {.root = 0}).wait();
  int highest = me % 2;
  while (highest + 2 < world) highest += 2;
  EXPECT_EQ(first.item_at(0), highest);

  auto none = comm->split(me == 0 ? kNoColor : 1, me);
  EXPECT_EQ(none == nullptr, me == 0);
  if (none) testing::run_collective_suite(*none);
  comm->barrier().wait();
}

TEST(Mpi, TwoCommunicatorsAliveAtOnce) {
  WEFT_REQUIRE_MPIRUN();
  auto a = mpi_world();
  auto b = mpi_world();
  const int me = a->rank();
  std::thread ta([&] {
    for (int i = 0; i < 20; ++i) {
      Tensor t = Tensor::from_vector<float>({1}, {float(me)});
      a->all_reduce(t, {.op = ReduceOp::kMax}).wait();
      EXPECT_EQ(t.item(), double(a->size() - 1));
    }
  });
  for (int i = 0; i < 20; ++i) {
    Tensor t = Tensor::from_vector<float>({1}, {float(me)});
    b->all_reduce(t, {.op = ReduceOp::kMin}).wait();
    EXPECT_EQ(t.item(), 0.0);
  }
  ta.join();
}

// The last rank joins the collective only after the others timed out (MPI cannot outlive a
// dead process, so a live but absent peer is the failure MPI lets us test). Its late call
// completes the abandoned collective, so the run ends clean.
TEST(Mpi, AbsentPeerMakesTheOthersTimeOut) {
  WEFT_REQUIRE_MPIRUN();
  auto comm = mpi_world(2s);
  auto control = mpi_world();
  const int me = comm->rank(), last = comm->size() - 1;
  Tensor t = Tensor::zeros({8}, DType::kF32);
  if (me != last) {
    EXPECT_THROW(comm->all_reduce(t).wait(), TimeoutError);
    // Failed for good: later calls report it at once.
    EXPECT_THROW(comm->barrier().wait(), TimeoutError);
    control->barrier().wait();
  } else {
    control->barrier().wait();
    comm->all_reduce(t).wait();
  }
  control->barrier().wait();
}

TEST(Mpi, AbortFromAnotherThreadFailsThePendingWait) {
  WEFT_REQUIRE_MPIRUN();
  auto comm = mpi_world(60s);
  auto control = mpi_world();
  const int me = comm->rank(), last = comm->size() - 1;
  Tensor t = Tensor::zeros({8}, DType::kF32);
  if (me != last) {
    Work w = comm->all_reduce(t);
    std::thread aborter([&] {
      std::this_thread::sleep_for(100ms);
      comm->abort("mpi test abort");
    });
    try {
      w.wait();
      ADD_FAILURE() << "all_reduce succeeded although aborted";
    } catch (const TimeoutError& e) {
      ADD_FAILURE() << "abort did not interrupt the wait: " << e.what();
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("mpi test abort"), std::string::npos) << e.what();
    }
    aborter.join();
    EXPECT_TRUE(comm->aborted());
    EXPECT_THROW(comm->barrier().wait(), CommError);
    control->barrier().wait();
  } else {
    control->barrier().wait();
    comm->all_reduce(t).wait();  // completes the collective the others abandoned
  }
  control->barrier().wait();
}

}  // namespace
}  // namespace weft::comm
