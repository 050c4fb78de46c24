// The parts of the CUDA backend that need no GPU: the arena's bookkeeping under the
// memory/ allocators (over a host buffer standing in for device memory), argument checks,
// the op table's coverage and storage rule, and `weft train` refusing device: cuda
// without a GPU. These run everywhere the backend builds.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "base/error.h"
#include "core/cuda/arena.h"
#include "core/cuda/gemm.h"
#include "core/cuda/kernels.h"
#include "core/cuda/ops_cuda.h"
#include "core/config/job_spec.h"
#include "core/cuda/runtime.h"
#include "core/cuda/trainer.h"
#include "core/graph/op_table.h"
#include "core/models/gpt.h"

namespace weft::core::cuda {
namespace {

constexpr size_t kSeg = memory::SegmentSource::kSegmentAlignment;

// A host range standing in for one cudaMalloc. aligned_alloc wants a size that is a
// multiple of the alignment; the range itself may end anywhere.
struct HostRange {
  explicit HostRange(size_t bytes)
      : p(std::aligned_alloc(kSeg, (bytes + kSeg - 1) / kSeg * kSeg)), bytes(bytes) {}
  ~HostRange() { std::free(p); }
  void* p;
  size_t bytes;
};

TEST(ArenaSegmentSource, BestFitSplitAndCoalesce) {
  HostRange r(64 * kSeg);
  ArenaSegmentSource a(r.p, r.bytes);
  char* base = static_cast<char*>(r.p);
  void* x = a.reserve(8 * kSeg);
  void* y = a.reserve(16 * kSeg);
  void* z = a.reserve(8 * kSeg);
  EXPECT_EQ(x, base);
  EXPECT_EQ(y, base + 8 * kSeg);
  EXPECT_EQ(z, base + 24 * kSeg);
  EXPECT_EQ(a.bytes_held(), 32 * kSeg);
  a.release(y, 16 * kSeg);  // a 16-segment hole and a 32-segment tail
  EXPECT_EQ(a.num_free_ranges(), 2u);
  // Best fit: a 12-segment request goes into the hole, not the tail.
  void* w = a.reserve(12 * kSeg);
  EXPECT_EQ(w, base + 8 * kSeg);
  a.release(w, 12 * kSeg);
  a.release(x, 8 * kSeg);
  a.release(z, 8 * kSeg);
  // Everything merged back into one range.
  EXPECT_EQ(a.num_free_ranges(), 1u);
  EXPECT_EQ(a.largest_free(), 64 * kSeg);
  EXPECT_EQ(a.bytes_held(), 0u);
  EXPECT_EQ(a.bytes_held_peak(), 32 * kSeg);
}

TEST(ArenaSegmentSource, ExhaustionAndMisuse) {
  HostRange r(8 * kSeg + 100);  // the ragged tail is never handed out
  ArenaSegmentSource a(r.p, r.bytes);
  EXPECT_EQ(a.capacity(), 8 * kSeg);
  void* x = a.reserve(8 * kSeg);
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(a.reserve(kSeg), nullptr);          // full: nullptr, not an exception
  EXPECT_THROW(a.reserve(100), InternalError);  // not a multiple of the alignment
  EXPECT_THROW(a.release(static_cast<char*>(x) + kSeg, kSeg), InternalError);  // not reserved
  EXPECT_THROW(a.release(x, kSeg), InternalError);                             // wrong size
  EXPECT_EQ(a.bytes_held(), 8 * kSeg);  // ... and nothing changed
  a.release(x, 8 * kSeg);
  EXPECT_EQ(a.bytes_held(), 0u);
}

TEST(ArenaSegmentSource, CachingAllocatorRunsOnTheArena) {
  HostRange r(64u << 20);
  ArenaSegmentSource a(r.p, r.bytes);
  memory::CachingAllocator alloc(memory::CachingOptions{}, &a);
  std::vector<void*> blocks;
  for (int i = 0; i < 50; ++i) blocks.push_back(alloc.allocate(size_t(1000 + 37000 * i)));
  for (void* p : blocks) {
    char* c = static_cast<char*>(p);
    EXPECT_TRUE(c >= static_cast<char*>(r.p) && c < static_cast<char*>(r.p) + r.bytes);
  }
  for (void* p : blocks) alloc.free(p);
  EXPECT_GT(a.bytes_held(), 0u);  // cached, as PyTorch's allocator keeps its segments
  alloc.empty_cache();
  EXPECT_EQ(a.bytes_held(), 0u);
  // Past the arena's capacity the allocator reports out of memory like a full device.
  EXPECT_THROW(alloc.allocate(size_t(80) << 20), std::bad_alloc);
}

// Step 0 through the recorder, then a plan from its trace, all inside the fixed arena.
TEST(DeviceAllocators, PlannedArenaReplaysStepZero) {
  HostRange r(64u << 20);
  ArenaSegmentSource a(r.p, r.bytes);
  DeviceAllocators d(a, "planned");
  auto one_step = [&](int64_t step) {
    d.begin_step(step);
    memory::Allocator& act = d.activations();
    act.set_phase(memory::Phase::kForward, 0);
    void* x = act.allocate(3 << 20, memory::Tag::kActivation);
    void* y = act.allocate(5 << 20, memory::Tag::kActivation);
    act.set_phase(memory::Phase::kBackward, 0);
    act.free(x);
    void* z = act.allocate(2 << 20, memory::Tag::kActivation);
    act.free(y);
    act.free(z);
  };
  one_step(0);
  EXPECT_EQ(d.activations().name(), "trace+caching");
  one_step(1);
  EXPECT_NE(d.activations().name().find("planned"), std::string::npos) << d.activations().name();
  one_step(2);
  EXPECT_EQ(d.activation_stats().bytes_live, 0u);
  EXPECT_THROW(DeviceAllocators(a, "buddy"), InternalError);
}

TEST(CudaArgs, GemmChecksWithoutTouchingTheGpu) {
  bf16 dummy[4];
  GemmArgs g;
  g.M = 4, g.N = 8, g.K = 16;
  g.A = g.B = dummy;
  g.C = dummy;
  g.lda = 16, g.ldb = 8, g.ldc = 8;
  EXPECT_NO_THROW(check_gemm_args(g));
  GemmArgs bad = g;
  bad.lda = 3;
  EXPECT_THROW(check_gemm_args(bad), InternalError);
  bad = g;
  bad.trans_b = true;  // B is then (N,K): ldb must be >= K
  EXPECT_THROW(check_gemm_args(bad), InternalError);
  bad = g;
  bad.epilogue = Epilogue::kBias;  // no bias pointer
  EXPECT_THROW(check_gemm_args(bad), InternalError);
  bad.bias = dummy;
  bad.c_f32 = true;  // epilogues write bf16 only
  EXPECT_THROW(check_gemm_args(bad), InternalError);
  bad = g;
  bad.epilogue = Epilogue::kBiasGelu;
  bad.bias = dummy;
  bad.aux = dummy;
  bad.ld_aux = 12;  // not a multiple of 8
  EXPECT_THROW(check_gemm_args(bad), InternalError);
}

TEST(CudaArgs, AttentionHeadSizes) {
  EXPECT_TRUE(attention_supported(768, 12));  // GPT-2: hs 64
  EXPECT_TRUE(attention_supported(64, 4));    // hs 16
  EXPECT_FALSE(attention_supported(96, 1));   // hs 96
  EXPECT_FALSE(attention_supported(10, 3));   // not divisible
  // Refused on the host, before any launch.
  EXPECT_THROW(attention_forward(nullptr, nullptr, nullptr, 1, 8, 96, 1, nullptr), NotSupported);
  EXPECT_THROW(attention_forward(nullptr, nullptr, nullptr, 1, 8, 10, 3, nullptr), InternalError);
}

TEST(CudaOpTable, EveryOpTypeHasACudaBinding) {
  for (const OpDef& d : all_op_defs()) {
    const CudaOpDef* c = nullptr;
    EXPECT_NO_THROW(c = &cuda_op_def(d.type)) << d.type;
    if (c) {
      EXPECT_NE(c->run, nullptr) << d.type;
    }
  }
  EXPECT_THROW(cuda_op_def("no-such-op"), InternalError);
}

TEST(CudaOpTable, StorageRuleOnGpt) {
  ModelSpec m;
  m.layers = 1, m.dim = 64, m.heads = 4, m.vocab = 128, m.seq_len = 16;
  ModelGraph mg = build_model(m, 2);
  TrainSpec t;
  add_training_ops(mg, t);
  const Graph& g = mg.graph;
  for (AttentionImpl impl : {AttentionImpl::kGemm, AttentionImpl::kFlash}) {
    for (const Op& op : g.ops()) {
      for (size_t k = 0; k < op.outputs.size(); ++k) {
        const Value& v = g.value(op.outputs[k]);
        DeviceLayout l = device_layout(g, op, k, impl);
        if (op.type == "attention" && k == 1 && impl == AttentionImpl::kFlash) {
          EXPECT_EQ(l.shape, (Shape{2, 4, 16})) << v.name;  // log-sum-exp, not (T,T)
          EXPECT_EQ(l.dtype, DType::kF32);
        } else if (op.type == "attention" && k == 1) {
          EXPECT_EQ(l.shape, (Shape{2, 4, 16, 16})) << v.name;  // probabilities, as the CPU
          EXPECT_EQ(l.dtype, DType::kBF16);
        } else if (v.persistent || v.role == Role::kScalar) {
          EXPECT_EQ(l.dtype, v.dtype) << v.name;  // f32 grads and state, f64 grad_norm
        } else if (op.type == "layernorm" && k > 0) {
          EXPECT_EQ(l.dtype, DType::kF32) << v.name;
        } else if (v.dtype == DType::kF32) {
          EXPECT_EQ(l.dtype, DType::kBF16) << v.name;
        }
      }
    }
  }
}

TEST(CudaOpTable, AttentionImplFromEnv) {
  unsetenv("WEFT_CUDA_ATTENTION");
  EXPECT_EQ(attention_impl_from_env(), AttentionImpl::kGemm);
  setenv("WEFT_CUDA_ATTENTION", "flash", 1);
  EXPECT_EQ(attention_impl_from_env(), AttentionImpl::kFlash);
  setenv("WEFT_CUDA_ATTENTION", "fast", 1);
  EXPECT_THROW(attention_impl_from_env(), InternalError);
  unsetenv("WEFT_CUDA_ATTENTION");
}

TEST(CudaArgs, BatchedGemmTakesNoEpilogue) {
  bf16 dummy[4];
  GemmArgs g;
  g.M = 4, g.N = 8, g.K = 16;
  g.A = g.B = dummy;
  g.C = dummy;
  g.lda = 16, g.ldb = 8, g.ldc = 8;
  g.batch = 3, g.stride_a = 64, g.stride_b = 128, g.stride_c = 32;
  EXPECT_NO_THROW(check_gemm_args(g));
  g.epilogue = Epilogue::kBias;
  g.bias = dummy;
  EXPECT_THROW(check_gemm_args(g), InternalError);
  g.epilogue = Epilogue::kNone;
  g.batch = 0;
  EXPECT_THROW(check_gemm_args(g), InternalError);
}

TEST(CudaTensor, HostOnlyOperationsRefuseDeviceTensors) {
  // Only the tag says "cuda" here (host bytes), so nothing is dereferenced on a GPU.
  Tensor t = Tensor::empty_on(Device::cuda(0), {4}, DType::kF32, memory::default_host_allocator());
  EXPECT_EQ(t.device(), Device::cuda(0));
  EXPECT_THROW(t.fill_(1.0), InternalError);
  EXPECT_THROW(t.zero_(), InternalError);
  EXPECT_THROW(t.item(), InternalError);
  EXPECT_THROW(t.clone(), InternalError);
  Tensor h = Tensor::empty({4}, DType::kF32);
  EXPECT_EQ(h.device(), Device::cpu());
  EXPECT_NO_THROW(h.fill_(1.0));
}

TEST(CudaDevice, RequireDeviceNamesTheField) {
  if (device_count() > 0) GTEST_SKIP() << "a GPU is present: nothing to refuse";
  try {
    require_device("device");
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "device");
    EXPECT_NE(std::string(e.what()).find("GPU"), std::string::npos) << e.what();
  }
}

TEST(CudaDevice, WeftTrainWithoutGpuExitsTwo) {
  if (device_count() > 0) GTEST_SKIP() << "a GPU is present: nothing to refuse";
  ASSERT_EQ(::access(WEFT_BINARY, X_OK), 0) << WEFT_BINARY << " is built with every test binary";
  std::string cmd = std::string(WEFT_BINARY) + " train --config " + WEFT_SOURCE_DIR +
                    "/configs/gpt-tiny.yaml --set device=cuda 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_NE(out.find("device"), std::string::npos) << out;
  EXPECT_NE(out.find("GPU"), std::string::npos) << out;
}

// Runs without a GPU: the refusal comes before the device is touched.
TEST(CudaTrainerConfig, GlobalBalancingIsRefusedNamingTheField) {
  JobSpec s = load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/moe-layout.yaml",
                            {"model.moe.balance=loss_free", "device=cuda"});
  try {
    CudaTrainer t(s);
    FAIL() << "loss_free was accepted on cuda";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "model.moe.balance");
  }
}

}  // namespace
}  // namespace weft::core::cuda
