// The NCCL backend (label cuda): a world of one on one GPU, on managed memory so that the
// test can fill and read buffers from the host. Without a GPU the collectives skip, and the
// factory must refuse with a clear CommError.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <new>

#include "base/error.h"
#include "comm/registry.h"
#include "memory/allocator.h"
#include "tests/comm/comm_test_util.h"

namespace weft::comm {
namespace {

using namespace std::chrono_literals;
using core::DType;
using core::Tensor;

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

#define WEFT_REQUIRE_GPU() \
  if (gpu_count() == 0) GTEST_SKIP() << "no GPU: cudaGetDeviceCount gave 0"

// Managed memory: device-accessible for NCCL, host-accessible for the checks.
class ManagedAllocator : public memory::Allocator {
 public:
  void* allocate(size_t bytes, memory::Tag) override {
    void* p = nullptr;
    if (cudaMallocManaged(&p, bytes ? bytes : 1) != cudaSuccess) throw std::bad_alloc();
    return p;
  }
  void free(void* p) override { cudaFree(p); }
  memory::AllocatorStats stats() const override { return {}; }
  std::string name() const override { return "cuda-managed"; }
};

Tensor managed(ManagedAllocator& alloc, DType dtype, const std::vector<double>& values) {
  Tensor t = Tensor::empty({int64_t(values.size())}, dtype, &alloc);
  t.copy_from(testing::make_tensor(dtype, values));
  return t;
}

std::unique_ptr<Communicator> nccl_one() {
  CommOptions o;
  o.rank = 0;
  o.size = 1;
  o.timeout = 20s;
  return make_communicator(BackendKind::kNccl, o);
}

TEST(Nccl, WithoutAGpuTheFactoryRefusesClearly) {
  if (gpu_count() > 0) GTEST_SKIP() << "a GPU is present";
  try {
    nccl_one();
    ADD_FAILURE() << "built an NCCL communicator without a GPU";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(Nccl, WorldOfOneRunsEveryCollective) {
  WEFT_REQUIRE_GPU();
  ManagedAllocator alloc;
  auto comm = nccl_one();
  ASSERT_EQ(comm->size(), 1);
  for (DType dtype : testing::all_dtypes()) {
    std::vector<double> v = {1, 2, 3, 4, 5, 6, 7};
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      Tensor t = managed(alloc, dtype, v);
      comm->all_reduce(t, {.op = op}).wait();
      testing::check_values(t, v, testing::label(dtype, 7, reduce_op_name(op)));
    }
    Tensor in = managed(alloc, dtype, v);
    Tensor out = managed(alloc, dtype, std::vector<double>(7, 0));
    comm->all_gather(out, in).wait();
    testing::check_values(out, v, testing::label(dtype, 7, "all_gather"));
    Tensor rs = managed(alloc, dtype, std::vector<double>(7, 0));
    comm->reduce_scatter(rs, in).wait();
    testing::check_values(rs, v, testing::label(dtype, 7, "reduce_scatter"));
    Tensor a2a = managed(alloc, dtype, std::vector<double>(7, 0));
    comm->all_to_all_v(a2a, {7}, in, {7}).wait();
    testing::check_values(a2a, v, testing::label(dtype, 7, "all_to_all_v"));
    comm->broadcast(in, {.root = 0}).wait();
    testing::check_values(in, v, testing::label(dtype, 7, "broadcast"));
  }
  comm->barrier().wait();
  auto sub = comm->split(0, 0);
  ASSERT_NE(sub, nullptr);
  Tensor t = managed(alloc, DType::kF32, {2, 4});
  sub->all_reduce(t, {.op = ReduceOp::kAvg}).wait();
  testing::check_values(t, {2, 4}, "all_reduce on the split communicator");
}

TEST(Nccl, HostMemoryIsRejectedAndAbortFailsLaterCalls) {
  WEFT_REQUIRE_GPU();
  ManagedAllocator alloc;
  auto comm = nccl_one();
  EXPECT_THROW(comm->all_reduce(Tensor::zeros({4}, DType::kF32)), InternalError);
  EXPECT_THROW(comm->send(managed(alloc, DType::kF32, {1}), 0), NotSupported);
  comm->abort("nccl test abort");
  EXPECT_TRUE(comm->aborted());
  EXPECT_THROW(comm->all_reduce(managed(alloc, DType::kF32, {1})).wait(), CommError);
}

}  // namespace
}  // namespace weft::comm
