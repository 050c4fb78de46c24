// NcclCommunicator: NCCL calls are enqueued on the communicator's stream at the call, then a
// CUDA event marks completion; Works poll the event and NCCL's asynchronous error against
// their timeout, and abort the NCCL communicator when it passes (NCCL itself never times out).
#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/check.h"
#include "comm/backend.h"
#include "base/foreign_checks.h"
#include "comm/store/store.h"

namespace weft::comm {

namespace {

ncclDataType_t nccl_type(core::DType t) {
  switch (t) {
    case core::DType::kF32:
      return ncclFloat32;
    case core::DType::kF64:
      return ncclFloat64;
    case core::DType::kBF16:
      return ncclBfloat16;
    case core::DType::kI32:
      return ncclInt32;
    case core::DType::kI64:
      return ncclInt64;
    case core::DType::kU8:
      return ncclUint8;
  }
  WEFT_CHECK(false, "nccl: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  WEFT_CHECK(false, "nccl: unknown op");
}

// The NCCL communicator and its failure state, shared with Works that may outlive the
// Communicator: the last owner finalises (healthy) or aborts (failed) it.
struct NcclShared {
  ncclComm_t comm = nullptr;
  int device = 0;
  std::mutex mu;
  std::exception_ptr error;
  bool aborted = false;

  ~NcclShared() {
    if (!comm) return;
    cudaSetDevice(device);
    if (!failed()) {
      // Flush and release; a finalise that does not end in time becomes an abort.
      ncclResult_t state = ncclCommFinalize(comm);
      const auto expires = Clock::now() + std::chrono::seconds(10);
      while (state == ncclInProgress && Clock::now() < expires) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(comm);
        return;
      }
    }
    abort_comm();
  }

  bool failed() {
    std::lock_guard<std::mutex> lock(mu);
    return error != nullptr;
  }
  std::exception_ptr get() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
  // Records the first failure and aborts the NCCL communicator, which unblocks its kernels
  // here and makes the peers' operations fail.
  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::move(e);
    }
    abort_comm();
  }
  void abort_comm() {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted || !comm) return;
    aborted = true;
    ncclCommAbort(comm);
  }
};

// Polls the communicator until a non-blocking NCCL call has been enqueued (ncclInProgress
// ends), raising NCCL's error or a timeout.
void await_enqueued(NcclShared& s, Clock::time_point expires, const std::string& what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    WEFT_NCCL_CHECK(ncclCommGetAsyncError(s.comm, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) WEFT_NCCL_CHECK(state);
    if (Clock::now() >= expires)
      throw TimeoutError(str(what, ": NCCL did not accept the call in time"));
    std::this_thread::yield();
  }
}

class NcclWork : public WorkImpl {
 public:
  NcclWork(std::shared_ptr<NcclShared> shared, cudaEvent_t event, std::string what, Millis timeout,
           std::vector<core::Tensor> tensors)
      : shared_(std::move(shared)),
        event_(event),
        what_(std::move(what)),
        timeout_(timeout),
        expires_(Clock::now() + timeout),
        tensors_(std::move(tensors)) {}

  // The GPU may still use the buffers of an unfinished operation: keep them, leak on purpose.
  ~NcclWork() override {
    if (!finished_) (void)new std::vector<core::Tensor>(std::move(tensors_));
    cudaEventDestroy(event_);
  }

  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    poll_locked();
    return finished_;
  }

  void wait_until(std::optional<Clock::time_point> deadline) override {
    for (int spins = 0;; ++spins) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        poll_locked();
        if (finished_) {
          if (error_) std::rethrow_exception(error_);
          return;
        }
      }
      if (deadline && Clock::now() >= *deadline)
        throw TimeoutError(str("Work::wait: ", what_, " still running at the wait's timeout"));
      if (spins < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

 private:
  void poll_locked() {
    if (finished_) return;
    if (std::exception_ptr e = shared_->get()) return fail_locked(e);
    cudaError_t q = cudaEventQuery(event_);
    if (q == cudaSuccess) {
      finished_ = true;
      tensors_.clear();
      return;
    }
    try {
      if (q != cudaErrorNotReady) WEFT_CUDA_CHECK(q);
      ncclResult_t state = ncclSuccess;
      WEFT_NCCL_CHECK(ncclCommGetAsyncError(shared_->comm, &state));
      if (state != ncclInProgress) WEFT_NCCL_CHECK(state);
      if (Clock::now() >= expires_)
        throw TimeoutError(str(what_, " timed out after ", timeout_.count(), " ms"));
    } catch (...) {
      shared_->fail(std::current_exception());
      fail_locked(shared_->get());
    }
  }

  void fail_locked(std::exception_ptr e) {
    finished_ = true;
    error_ = std::move(e);
  }

  std::shared_ptr<NcclShared> shared_;
  cudaEvent_t event_;
  std::string what_;
  Millis timeout_;
  Clock::time_point expires_;
  std::vector<core::Tensor> tensors_;
  std::mutex mu_;
  bool finished_ = false;
  std::exception_ptr error_;
};

class NcclCommunicator final : public Backend {
 public:
  NcclCommunicator(std::shared_ptr<NcclShared> shared, int rank, int size, Millis timeout)
      : Backend(BackendKind::kNccl, rank, size, timeout), shared_(std::move(shared)) {
    WEFT_CUDA_CHECK(cudaSetDevice(shared_->device));
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    WEFT_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
  }

  ~NcclCommunicator() override {
    cudaSetDevice(shared_->device);
    shared_.reset();  // finalises or aborts unless Works still hold it
    cudaStreamDestroy(stream_);
    cudaEventDestroy(ready_);
    cudaFree(scratch_);
  }

 protected:
  void check_buffer(const core::Tensor& t, const char* what) const override {
    if (t.nbytes() == 0) return;  // nothing is read or written
    cudaPointerAttributes attr{};
    cudaError_t rc = cudaPointerGetAttributes(&attr, t.raw_data());
    cudaGetLastError();  // a host pointer may leave a sticky "invalid value" behind
    WEFT_CHECK(rc == cudaSuccess &&
                   (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) &&
                   attr.device == shared_->device,
               describe(what), ": buffer is not device memory on GPU ", shared_->device);
  }

  Work do_all_reduce(const core::Tensor& t, ReduceOp op, Millis timeout) override {
    return run(describe("all_reduce", &t), timeout, {t}, [&] {
      WEFT_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), size_t(t.numel()),
                                    nccl_type(t.dtype()), nccl_op(op), shared_->comm, stream_));
    });
  }

  // Equal parts use ncclReduceScatter; uneven ones one ncclReduce per owner, grouped.
  Work do_reduce_scatter(const core::Tensor& out, const core::Tensor& in, ReduceOp op,
                         const std::vector<int64_t>& counts, Millis timeout) override {
    const bool even =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
    const auto offsets = offsets_of(counts);
    const size_t esize = core::dtype_size(in.dtype());
    return run(describe("reduce_scatter", &in), timeout, {out, in}, [&] {
      if (even) {
        WEFT_NCCL_CHECK(ncclReduceScatter(in.raw_data(), out.raw_data(), size_t(counts[0]),
                                          nccl_type(in.dtype()), nccl_op(op), shared_->comm,
                                          stream_));
        return;
      }
      WEFT_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size(); ++r) {
        const char* src =
            static_cast<const char*>(in.raw_data()) + size_t(offsets[size_t(r)]) * esize;
        WEFT_NCCL_CHECK(ncclReduce(src, out.raw_data(), size_t(counts[size_t(r)]),
                                   nccl_type(in.dtype()), nccl_op(op), r, shared_->comm, stream_));
      }
      WEFT_NCCL_CHECK(ncclGroupEnd());
    });
  }

  // Equal parts use ncclAllGather; uneven ones one ncclBroadcast per contributor, grouped.
  Work do_all_gather(const core::Tensor& out, const core::Tensor& in,
                     const std::vector<int64_t>& counts, Millis timeout) override {
    const bool even =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
    const auto offsets = offsets_of(counts);
    const size_t esize = core::dtype_size(in.dtype());
    return run(describe("all_gather", &in), timeout, {out, in}, [&] {
      if (even) {
        WEFT_NCCL_CHECK(ncclAllGather(in.raw_data(), out.raw_data(), size_t(counts[0]),
                                      nccl_type(in.dtype()), shared_->comm, stream_));
        return;
      }
      WEFT_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size(); ++r) {
        char* dst = static_cast<char*>(out.raw_data()) + size_t(offsets[size_t(r)]) * esize;
        WEFT_NCCL_CHECK(ncclBroadcast(in.raw_data(), dst, size_t(counts[size_t(r)]),
                                      nccl_type(in.dtype()), r, shared_->comm, stream_));
      }
      WEFT_NCCL_CHECK(ncclGroupEnd());
    });
  }

  Work do_broadcast(const core::Tensor& t, int root, Millis timeout) override {
    return run(describe("broadcast", &t), timeout, {t}, [&] {
      WEFT_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), size_t(t.numel()),
                                    nccl_type(t.dtype()), root, shared_->comm, stream_));
    });
  }

  Work do_all_to_all_v(const core::Tensor& out, const std::vector<int64_t>& out_counts,
                       const core::Tensor& in, const std::vector<int64_t>& in_counts,
                       Millis timeout) override {
    const auto in_off = offsets_of(in_counts), out_off = offsets_of(out_counts);
    const size_t esize = core::dtype_size(in.dtype());
    return run(describe("all_to_all_v", &in), timeout, {out, in}, [&] {
      const char* src = static_cast<const char*>(in.raw_data());
      char* dst = static_cast<char*>(out.raw_data());
      const size_t me = size_t(rank());
      WEFT_CUDA_CHECK(
          cudaMemcpyAsync(dst + size_t(out_off[me]) * esize, src + size_t(in_off[me]) * esize,
                          size_t(in_counts[me]) * esize, cudaMemcpyDeviceToDevice, stream_));
      WEFT_NCCL_CHECK(ncclGroupStart());
      for (size_t p = 0; p < size_t(size()); ++p) {
        if (p == me) continue;
        WEFT_NCCL_CHECK(ncclSend(src + size_t(in_off[p]) * esize, size_t(in_counts[p]),
                                 nccl_type(in.dtype()), int(p), shared_->comm, stream_));
        WEFT_NCCL_CHECK(ncclRecv(dst + size_t(out_off[p]) * esize, size_t(out_counts[p]),
                                 nccl_type(in.dtype()), int(p), shared_->comm, stream_));
      }
      WEFT_NCCL_CHECK(ncclGroupEnd());
    });
  }

  Work do_send(const core::Tensor& t, int peer, int tag, Millis timeout) override {
    WEFT_ENSURE(peer != rank(), NotSupported, "nccl: send to oneself; copy locally instead");
    WEFT_ENSURE(tag == 0, NotSupported, "nccl: tags (", tag, "); NCCL matches by order only");
    return run(str(describe("send", &t), " to ", peer), timeout, {t}, [&] {
      WEFT_NCCL_CHECK(ncclSend(t.raw_data(), t.nbytes(), ncclUint8, peer, shared_->comm, stream_));
    });
  }

  Work do_recv(const core::Tensor& t, int peer, int tag, Millis timeout) override {
    WEFT_ENSURE(peer != rank(), NotSupported, "nccl: recv from oneself; copy locally instead");
    WEFT_ENSURE(tag == 0, NotSupported, "nccl: tags (", tag, "); NCCL matches by order only");
    return run(str(describe("recv", &t), " from ", peer), timeout, {t}, [&] {
      WEFT_NCCL_CHECK(ncclRecv(t.raw_data(), t.nbytes(), ncclUint8, peer, shared_->comm, stream_));
    });
  }

  Work do_barrier(Millis timeout) override {
    return run(describe("barrier"), timeout, {}, [&] {
      WEFT_NCCL_CHECK(
          ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, shared_->comm, stream_));
    });
  }

  std::unique_ptr<Communicator> do_split(int color, int key, Millis timeout) override {
    if (std::exception_ptr e = shared_->get()) std::rethrow_exception(e);
    WEFT_CUDA_CHECK(cudaSetDevice(shared_->device));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t sub = nullptr;
    const auto expires = Clock::now() + timeout;
    try {
      WEFT_NCCL_CHECK(
          ncclCommSplit(shared_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config));
      await_enqueued(*shared_, expires, describe("split"));
    } catch (...) {
      shared_->fail(std::current_exception());
      throw;
    }
    if (!sub) return nullptr;
    auto child = std::make_shared<NcclShared>();
    child->comm = sub;
    child->device = shared_->device;
    await_enqueued(*child, expires, describe("split (new communicator)"));
    int sub_rank = -1, sub_size = 0;
    WEFT_NCCL_CHECK(ncclCommUserRank(sub, &sub_rank));
    WEFT_NCCL_CHECK(ncclCommCount(sub, &sub_size));
    return std::make_unique<NcclCommunicator>(std::move(child), sub_rank, sub_size,
                                              this->timeout());
  }

  void do_abort(const std::string&) noexcept override { shared_->fail(failure()); }

 private:
  // Orders the stream after the legacy default stream, enqueues, records the completion event.
  template <typename EnqueueFn>
  Work run(std::string what, Millis timeout, std::vector<core::Tensor> tensors, EnqueueFn&& fn) {
    if (std::exception_ptr e = shared_->get()) return Work::failed(e);
    cudaEvent_t done = nullptr;
    try {
      WEFT_CUDA_CHECK(cudaSetDevice(shared_->device));
      WEFT_CUDA_CHECK(cudaEventRecord(ready_, cudaStreamLegacy));
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
      fn();
      await_enqueued(*shared_, Clock::now() + timeout, what);
      WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
      WEFT_CUDA_CHECK(cudaEventRecord(done, stream_));
    } catch (const CommError&) {
      if (done) cudaEventDestroy(done);
      shared_->fail(std::current_exception());
      return Work::failed(shared_->get());
    }
    return Work(
        std::make_shared<NcclWork>(shared_, done, std::move(what), timeout, std::move(tensors)));
  }

  std::shared_ptr<NcclShared> shared_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& opts) {
  WEFT_CHECK(opts.size >= 1 && opts.rank >= 0 && opts.rank < opts.size, "nccl: rank ", opts.rank,
             " of a world of ", opts.size);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    throw CommError("nccl: no CUDA device is visible to this process");
  }
  const int device = opts.device >= 0 ? opts.device : opts.rank % devices;
  WEFT_CUDA_CHECK(cudaSetDevice(device));

  ncclUniqueId id;
  if (opts.size == 1 && !opts.store) {
    WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
  } else {
    WEFT_CHECK(opts.store != nullptr, "nccl: a world of ", opts.size, " needs CommOptions::store");
    const std::string key = opts.prefix + "/nccl/unique_id";
    if (opts.rank == 0) {
      WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      opts.store->set(key, Bytes(p, p + sizeof(id)));
    } else {
      opts.store->wait({key}, opts.timeout);
      Bytes b = opts.store->get(key);
      WEFT_ENSURE(b.size() == sizeof(id), CommError, "nccl: unique id at '", key, "' has ",
                  b.size(), " bytes, expected ", sizeof(id));
      std::memcpy(&id, b.data(), sizeof(id));
    }
  }

  auto shared = std::make_shared<NcclShared>();
  shared->device = device;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a timeout can abort a pending init or collective
  WEFT_NCCL_CHECK(ncclCommInitRankConfig(&shared->comm, opts.size, id, opts.rank, &config));
  try {
    await_enqueued(*shared, Clock::now() + opts.timeout, "nccl: ncclCommInitRankConfig");
  } catch (...) {
    shared->fail(std::current_exception());
    throw;
  }
  return std::make_unique<NcclCommunicator>(std::move(shared), opts.rank, opts.size, opts.timeout);
}

}  // namespace weft::comm
