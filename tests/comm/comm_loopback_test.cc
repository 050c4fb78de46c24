// The in-process parts of comm/: the loopback backend (world of one) against the reference
// suite, Work semantics, messages to oneself, argument checks, the backend table and the
// reduction kernels.
#include <gtest/gtest.h>

#include <thread>

#include "base/config.h"
#include "base/error.h"
#include "comm/backend.h"
#include "comm/reduce.h"
#include "comm/registry.h"
#include "tests/comm/comm_test_util.h"

namespace weft::comm {
namespace {

using namespace std::chrono_literals;
using core::DType;
using core::Tensor;

std::unique_ptr<Communicator> loopback(Millis timeout = 5s) {
  CommOptions o;
  o.timeout = timeout;
  return make_communicator(BackendKind::kLoopback, o);
}

TEST(Loopback, EveryCollectiveOnEveryDtypeMatchesTheReference) {
  auto comm = loopback();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), BackendKind::kLoopback);
  testing::run_collective_suite(*comm);
}

TEST(Loopback, RecvBeforeSendCompletesWhenTheSendArrives) {
  auto comm = loopback();
  Tensor in = Tensor::empty({3}, DType::kI32);
  Work r = comm->recv(in, 0, {.tag = 4});
  EXPECT_FALSE(r.done());
  // A wait that gives up leaves the operation pending.
  EXPECT_THROW(r.wait(10ms), TimeoutError);
  EXPECT_FALSE(r.done());
  // Another tag does not match.
  Tensor other = Tensor::from_vector<int32_t>({3}, {7, 7, 7});
  comm->send(other, 0, {.tag = 5}).wait();
  EXPECT_FALSE(r.done());
  comm->send(Tensor::from_vector<int32_t>({3}, {1, 2, 3}), 0, {.tag = 4}).wait();
  EXPECT_TRUE(r.done());
  r.wait();
  EXPECT_EQ(in.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3}));
  // Messages with one tag arrive in order.
  comm->send(Tensor::from_vector<int32_t>({3}, {4, 5, 6}), 0, {.tag = 4}).wait();
  comm->send(Tensor::from_vector<int32_t>({3}, {8, 9, 10}), 0, {.tag = 4}).wait();
  comm->recv(in, 0, {.tag = 4}).wait();
  EXPECT_EQ(in.to_vector<int32_t>(), (std::vector<int32_t>{4, 5, 6}));
  comm->recv(in, 0, {.tag = 4}).wait();
  EXPECT_EQ(in.to_vector<int32_t>(), (std::vector<int32_t>{8, 9, 10}));
  comm->recv(in, 0, {.tag = 5}).wait();
  EXPECT_EQ(in.to_vector<int32_t>(), (std::vector<int32_t>{7, 7, 7}));
}

TEST(Loopback, RecvWithoutSendTimesOutAndIsNotWrittenLater) {
  auto comm = loopback();
  Tensor in = Tensor::from_vector<float>({2}, {-1, -1});
  Work r = comm->recv(in, 0, {.tag = 1, .timeout = 20ms});
  EXPECT_THROW(r.wait(), TimeoutError);
  EXPECT_TRUE(r.done());
  // The expired recv no longer matches: the next send waits for a new recv.
  comm->send(Tensor::from_vector<float>({2}, {3, 4}), 0, {.tag = 1}).wait();
  EXPECT_EQ(in.to_vector<float>(), (std::vector<float>{-1, -1}));
  comm->recv(in, 0, {.tag = 1}).wait();
  EXPECT_EQ(in.to_vector<float>(), (std::vector<float>{3, 4}));
}

TEST(Loopback, SizeMismatchFailsTheRecv) {
  auto comm = loopback();
  comm->send(Tensor::zeros({4}, DType::kF32), 0, {}).wait();
  Tensor small = Tensor::empty({2}, DType::kF32);
  EXPECT_THROW(comm->recv(small, 0, {}).wait(), CommError);
}

TEST(Loopback, AbortFailsPendingAndLaterCalls) {
  auto comm = loopback();
  Tensor in = Tensor::empty({1}, DType::kF32);
  Work pending = comm->recv(in, 0, {.tag = 2});
  std::thread aborter([&] { comm->abort("shutting down"); });
  aborter.join();
  EXPECT_TRUE(comm->aborted());
  EXPECT_TRUE(pending.done());
  try {
    pending.wait();
    ADD_FAILURE() << "recv succeeded after abort";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("shutting down"), std::string::npos) << e.what();
  }
  Tensor t = Tensor::zeros({4}, DType::kF32);
  Work later = comm->all_reduce(t);
  EXPECT_TRUE(later.done());
  EXPECT_THROW(later.wait(), CommError);
  EXPECT_THROW(comm->split(0, 0), CommError);
  comm->abort("twice is fine");
  EXPECT_THROW(later.wait(), CommError);
}

TEST(Loopback, SplitGivesAWorldOfOneOrNothing) {
  auto comm = loopback();
  EXPECT_EQ(comm->split(kNoColor, 0), nullptr);
  EXPECT_EQ(comm->split(-5, 0), nullptr);
  auto sub = comm->split(3, 9);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  Tensor t = Tensor::from_vector<float>({1}, {2.5f});
  sub->all_reduce(t, {.op = ReduceOp::kAvg}).wait();
  EXPECT_EQ(t.item(), 2.5);
}

TEST(Loopback, BadArgumentsThrowBeforeAnythingMoves) {
  auto comm = loopback();
  Tensor f = Tensor::zeros({4}, DType::kF32);
  Tensor d = Tensor::zeros({4}, DType::kF64);
  EXPECT_THROW(comm->all_reduce(Tensor()), InternalError);
  EXPECT_THROW(comm->all_reduce(Tensor::zeros({2, 3}, DType::kF32).slice(1, 0, 2)), InternalError);
  EXPECT_THROW(comm->all_gather(d, f), InternalError);                                // dtype
  EXPECT_THROW(comm->all_gather(Tensor::zeros({3}, DType::kF32), f), InternalError);  // numel
  EXPECT_THROW(comm->reduce_scatter(f, f, {.counts = {3}}), InternalError);           // counts sum
  EXPECT_THROW(comm->reduce_scatter(f, f, {.counts = {4, 0}}), InternalError);        // world
  EXPECT_THROW(comm->broadcast(f, {.root = 1}), InternalError);
  EXPECT_THROW(comm->send(f, 1), InternalError);
  EXPECT_THROW(comm->recv(f, -1), InternalError);
  EXPECT_THROW(comm->send(f, 0, {.tag = kMaxTag + 1}), InternalError);
  EXPECT_THROW(comm->all_to_all_v(f, {3}, f, {4}), InternalError);
  EXPECT_THROW(comm->all_reduce(f, {.timeout = 0ms}), InternalError);
}

TEST(Loopback, WorkHandlesShareOneOperation) {
  Work none;
  EXPECT_TRUE(none.done());
  none.wait();
  Work failed = Work::failed(std::make_exception_ptr(PeerLostError(3, "gone")));
  Work copy = failed;
  EXPECT_TRUE(copy.done());
  for (int i = 0; i < 2; ++i) {
    try {
      copy.wait();
      ADD_FAILURE() << "a failed Work returned";
    } catch (const PeerLostError& e) {
      EXPECT_EQ(e.peer(), 3);
    }
  }
  auto completion = std::make_shared<Completion>("test op");
  Work w(completion);
  EXPECT_FALSE(w.done());
  std::thread t([&] { completion->complete(); });
  w.wait();
  t.join();
  completion->fail(std::make_exception_ptr(CommError("late")));  // the first outcome stays
  w.wait();
}

TEST(Registry, TableMatchesTheBuild) {
  auto kinds = available_backends();
  ASSERT_FALSE(kinds.empty());
  EXPECT_EQ(kinds.front(), BackendKind::kLoopback);
  EXPECT_EQ(backend_available(BackendKind::kGloo), bool(WEFT_HAVE_GLOO));
  EXPECT_EQ(backend_available(BackendKind::kMpi), bool(WEFT_HAVE_MPI));
  EXPECT_EQ(backend_available(BackendKind::kNccl), bool(WEFT_HAVE_NCCL));
  for (BackendKind k : kinds) EXPECT_EQ(parse_backend(backend_name(k), "comm.backend"), k);
  EXPECT_THROW(parse_backend("infiniband", "comm.backend"), ConfigError);
  CommOptions o;
  o.rank = 1;
  EXPECT_THROW(make_communicator(BackendKind::kLoopback, o), InternalError);
}

TEST(ReduceKernels, IntegerSumsWrapAndAvgTruncates) {
  std::vector<uint8_t> a = {250, 3}, b = {10, 4}, out(2);
  reduce_elements(out.data(), a.data(), b.data(), 2, DType::kU8, ReduceOp::kSum);
  EXPECT_EQ(out, (std::vector<uint8_t>{4, 7}));
  std::vector<int32_t> v = {-7, 7, 9};
  divide_elements(v.data(), 3, DType::kI32, 2);
  EXPECT_EQ(v, (std::vector<int32_t>{-3, 3, 4}));
  std::vector<int64_t> x = {INT64_MAX, -2}, y = {1, 5}, z(2);
  reduce_elements(z.data(), x.data(), y.data(), 2, DType::kI64, ReduceOp::kMin);
  EXPECT_EQ(z, (std::vector<int64_t>{1, -2}));
}

TEST(ReduceKernels, Bf16GoesThroughF32WithRounding) {
  // 256 + 1 is not representable in bf16 (8 significant bits): rounds to even, 256.
  core::bf16 a = core::float_to_bf16(256.f), b = core::float_to_bf16(1.f), out;
  reduce_elements(&out, &a, &b, 1, DType::kBF16, ReduceOp::kSum);
  EXPECT_EQ(core::bf16_to_float(out), 256.f);
  core::bf16 c = core::float_to_bf16(3.f);
  reduce_elements(&out, &a, &c, 1, DType::kBF16, ReduceOp::kSum);
  EXPECT_EQ(core::bf16_to_float(out), 260.f);  // 259 rounds to 260
  reduce_elements(&out, &a, &c, 1, DType::kBF16, ReduceOp::kMax);
  EXPECT_EQ(core::bf16_to_float(out), 256.f);
  core::bf16 three = core::float_to_bf16(3.f);
  divide_elements(&three, 1, DType::kBF16, 2);
  EXPECT_EQ(core::bf16_to_float(three), 1.5f);
}

TEST(SplitPlan, OrdersByKeyThenOldRank) {
  // (color, key) per old rank
  std::vector<int64_t> ck = {1, 5, 0, 0, 1, 5, 1, -1, kNoColor, 0};
  SplitPlan p0 = plan_split(ck, 0);
  EXPECT_EQ(p0.color, 1);
  EXPECT_EQ(p0.members, (std::vector<int>{3, 0, 2}));
  EXPECT_EQ(p0.rank, 1);
  EXPECT_EQ(plan_split(ck, 2).rank, 2);
  EXPECT_EQ(plan_split(ck, 1).members, (std::vector<int>{1}));
  SplitPlan p4 = plan_split(ck, 4);
  EXPECT_EQ(p4.rank, -1);
  EXPECT_TRUE(p4.members.empty());
  EXPECT_EQ(balanced_counts(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(offsets_of({3, 0, 2}), (std::vector<int64_t>{0, 3, 3}));
}

}  // namespace
}  // namespace weft::comm
