// MpiCommunicator: every operation is started at the call as an MPI-3 non-blocking request
// (so MPI sees collectives in issue order) and its Work polls MPI_Test until it completes,
// the communicator is aborted, or its timeout passes.
#include "comm/mpi/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <functional>
#include <thread>

#include "base/check.h"
#include "comm/backend.h"
#include "base/foreign_checks.h"
#include "comm/reduce.h"

namespace weft::comm {

namespace {

// MPI is process-wide by nature: one initialisation, one set of user ops for bf16, and a lock
// that serialises MPI calls when the library grants less than MPI_THREAD_MULTIPLE.
class MpiRuntime {
 public:
  static MpiRuntime& get() {
    static MpiRuntime* runtime = new MpiRuntime();  // never destroyed: MPI_Finalize runs atexit
    return *runtime;
  }

  std::unique_lock<std::mutex> lock() {
    return multiple_ ? std::unique_lock<std::mutex>() : std::unique_lock<std::mutex>(mu_);
  }

  MPI_Datatype datatype(core::DType t) const {
    switch (t) {
      case core::DType::kF32:
        return MPI_FLOAT;
      case core::DType::kF64:
        return MPI_DOUBLE;
      case core::DType::kI32:
        return MPI_INT32_T;
      case core::DType::kI64:
        return MPI_INT64_T;
      case core::DType::kU8:
        return MPI_UINT8_T;
      case core::DType::kBF16:
        return MPI_UINT16_T;  // reduced with the user ops below
    }
    WEFT_CHECK(false, "mpi: unknown dtype");
  }

  // kAvg reduces as a sum; the Work divides afterwards.
  MPI_Op op(ReduceOp op, core::DType t) const {
    const bool bf16 = t == core::DType::kBF16;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return bf16 ? bf16_sum_ : MPI_SUM;
      case ReduceOp::kMax:
        return bf16 ? bf16_max_ : MPI_MAX;
      case ReduceOp::kMin:
        return bf16 ? bf16_min_ : MPI_MIN;
    }
    WEFT_CHECK(false, "mpi: unknown op");
  }

 private:
  MpiRuntime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      WEFT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    } else {
      MPI_Query_thread(&provided);
    }
    WEFT_ENSURE(provided >= MPI_THREAD_SERIALIZED, CommError,
                "mpi: the library grants only thread level ", provided,
                "; Weft needs at least MPI_THREAD_SERIALIZED");
    multiple_ = provided == MPI_THREAD_MULTIPLE;
    WEFT_MPI_CHECK(MPI_Op_create(&bf16_reduce<ReduceOp::kSum>, 1, &bf16_sum_));
    WEFT_MPI_CHECK(MPI_Op_create(&bf16_reduce<ReduceOp::kMax>, 1, &bf16_max_));
    WEFT_MPI_CHECK(MPI_Op_create(&bf16_reduce<ReduceOp::kMin>, 1, &bf16_min_));
  }

  template <ReduceOp kOp>
  static void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
    reduce_elements(inout, inout, in, size_t(*len), core::DType::kBF16, kOp);
  }

  bool multiple_ = false;
  std::mutex mu_;
  MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL, bf16_min_ = MPI_OP_NULL;
};

// The failure state a communicator shares with its Works, which may outlive it.
struct Health {
  std::mutex mu;
  std::exception_ptr error;
  void set(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::move(e);
  }
  std::exception_ptr get() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
};

// What an in-flight request needs alive: its buffers and the count arrays MPI reads.
struct Payload {
  std::vector<core::Tensor> tensors;
  std::vector<int> a, b, c, d;
};

class MpiWork : public WorkImpl {
 public:
  MpiWork(std::shared_ptr<Health> health, std::string what, Millis timeout,
          std::unique_ptr<Payload> payload, std::function<void()> finish)
      : health_(std::move(health)),
        what_(std::move(what)),
        timeout_(timeout),
        expires_(Clock::now() + timeout),
        payload_(std::move(payload)),
        finish_(std::move(finish)) {}

  // MPI may still read or write an abandoned request's buffers, so they are leaked on purpose.
  ~MpiWork() override {
    if (!request_done_) (void)payload_.release();
  }

  MPI_Request* request() { return &request_; }

  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    poll_locked();
    return finished_;
  }

  void wait_until(std::optional<Clock::time_point> deadline) override {
    const auto start = Clock::now();
    for (;;) {
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
      // MPI progresses only inside MPI calls, so the poll is the progress engine: yield
      // through the first 100 ms, then sleep briefly. `weft bench comm` measured the former
      // 200 us back-off at 2-3% of memcpy bandwidth from 1 MiB up (spinning: 1.6-3.3x
      // faster); the 20 us sleep after 100 ms keeps oversubscribed ranks from starving peers.
      if (Clock::now() - start < std::chrono::milliseconds(100))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

 private:
  void poll_locked() {
    if (finished_) return;
    if (std::exception_ptr e = health_->get()) return fail_locked(e);
    int flag = 0;
    try {
      auto lock = MpiRuntime::get().lock();
      WEFT_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
    } catch (...) {
      request_done_ = true;  // MPI returned an error for it: the request is gone
      health_->set(std::current_exception());
      return fail_locked(std::current_exception());
    }
    if (flag) {
      request_done_ = true;
      finished_ = true;
      try {
        if (finish_) finish_();
      } catch (...) {
        error_ = std::current_exception();
      }
      payload_.reset();
      return;
    }
    if (Clock::now() >= expires_) {
      auto e = std::make_exception_ptr(TimeoutError(
          str(what_, " timed out after ", timeout_.count(),
              " ms (a peer stopped participating, or issued collectives in another order)")));
      health_->set(e);
      fail_locked(e);
    }
  }

  void fail_locked(std::exception_ptr e) {
    finished_ = true;
    error_ = std::move(e);
  }

  std::shared_ptr<Health> health_;
  std::string what_;
  Millis timeout_;
  Clock::time_point expires_;
  std::unique_ptr<Payload> payload_;
  std::function<void()> finish_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::mutex mu_;
  bool request_done_ = false;
  bool finished_ = false;
  std::exception_ptr error_;
};

int to_int(int64_t v, const char* what) {
  WEFT_ENSURE(v <= INT_MAX, NotSupported, "mpi ", what, ": ", v,
              " elements exceed MPI's int counts; split the tensor");
  return int(v);
}

std::vector<int> to_ints(const std::vector<int64_t>& v, const char* what) {
  std::vector<int> out;
  out.reserve(v.size());
  for (int64_t x : v) out.push_back(to_int(x, what));
  return out;
}

class MpiCommunicator final : public Backend {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, Millis timeout)
      : Backend(BackendKind::kMpi, rank, size, timeout),
        comm_(comm),
        health_(std::make_shared<Health>()) {}

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    auto lock = MpiRuntime::get().lock();
    // MPI_Comm_free only marks the communicator; MPI releases it once pending requests end.
    if (!finalized) MPI_Comm_free(&comm_);
  }

 protected:
  Work do_all_reduce(const core::Tensor& t, ReduceOp op, Millis timeout) override {
    auto& rt = MpiRuntime::get();
    const core::DType dtype = t.dtype();
    const int n = to_int(t.numel(), "all_reduce");
    const int world = size();
    return start(
        describe("all_reduce", &t), timeout, {t},
        [&](MPI_Request* r, Payload&) {
          return MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), n, rt.datatype(dtype), rt.op(op, dtype),
                                comm_, r);
        },
        op == ReduceOp::kAvg ? std::function<void()>([t, dtype, world] {
          divide_elements(t.raw_data(), size_t(t.numel()), dtype, world);
        })
                             : nullptr);
  }

  Work do_reduce_scatter(const core::Tensor& out, const core::Tensor& in, ReduceOp op,
                         const std::vector<int64_t>& counts, Millis timeout) override {
    auto& rt = MpiRuntime::get();
    const core::DType dtype = in.dtype();
    const int world = size();
    auto payload_counts = to_ints(counts, "reduce_scatter");
    return start(
        describe("reduce_scatter", &in), timeout, {out, in},
        [&](MPI_Request* r, Payload& p) {
          p.a = payload_counts;
          return MPI_Ireduce_scatter(in.raw_data(), out.raw_data(), p.a.data(), rt.datatype(dtype),
                                     rt.op(op, dtype), comm_, r);
        },
        op == ReduceOp::kAvg ? std::function<void()>([out, dtype, world] {
          divide_elements(out.raw_data(), size_t(out.numel()), dtype, world);
        })
                             : nullptr);
  }

  Work do_all_gather(const core::Tensor& out, const core::Tensor& in,
                     const std::vector<int64_t>& counts, Millis timeout) override {
    MPI_Datatype type = MpiRuntime::get().datatype(in.dtype());
    auto c = to_ints(counts, "all_gather");
    auto d = to_ints(offsets_of(counts), "all_gather");
    to_int(out.numel(), "all_gather");
    return start(describe("all_gather", &in), timeout, {out, in}, [&](MPI_Request* r, Payload& p) {
      p.a = c;
      p.b = d;
      return MPI_Iallgatherv(in.raw_data(), int(in.numel()), type, out.raw_data(), p.a.data(),
                             p.b.data(), type, comm_, r);
    });
  }

  Work do_broadcast(const core::Tensor& t, int root, Millis timeout) override {
    MPI_Datatype type = MpiRuntime::get().datatype(t.dtype());
    const int n = to_int(t.numel(), "broadcast");
    return start(describe("broadcast", &t), timeout, {t}, [&](MPI_Request* r, Payload&) {
      return MPI_Ibcast(t.raw_data(), n, type, root, comm_, r);
    });
  }

  Work do_all_to_all_v(const core::Tensor& out, const std::vector<int64_t>& out_counts,
                       const core::Tensor& in, const std::vector<int64_t>& in_counts,
                       Millis timeout) override {
    MPI_Datatype type = MpiRuntime::get().datatype(in.dtype());
    auto sc = to_ints(in_counts, "all_to_all_v"),
         sd = to_ints(offsets_of(in_counts), "all_to_all_v");
    auto rc = to_ints(out_counts, "all_to_all_v"),
         rd = to_ints(offsets_of(out_counts), "all_to_all_v");
    to_int(in.numel(), "all_to_all_v");
    to_int(out.numel(), "all_to_all_v");
    return start(describe("all_to_all_v", &in), timeout, {out, in},
                 [&](MPI_Request* r, Payload& p) {
                   p.a = sc, p.b = sd, p.c = rc, p.d = rd;
                   return MPI_Ialltoallv(in.raw_data(), p.a.data(), p.b.data(), type,
                                         out.raw_data(), p.c.data(), p.d.data(), type, comm_, r);
                 });
  }

  Work do_send(const core::Tensor& t, int peer, int tag, Millis timeout) override {
    const int n = to_int(int64_t(t.nbytes()), "send");
    return start(str(describe("send", &t), " to ", peer, " tag ", tag), timeout, {t},
                 [&](MPI_Request* r, Payload&) {
                   return MPI_Isend(t.raw_data(), n, MPI_BYTE, peer, tag, comm_, r);
                 });
  }

  Work do_recv(const core::Tensor& t, int peer, int tag, Millis timeout) override {
    const int n = to_int(int64_t(t.nbytes()), "recv");
    return start(str(describe("recv", &t), " from ", peer, " tag ", tag), timeout, {t},
                 [&](MPI_Request* r, Payload&) {
                   return MPI_Irecv(t.raw_data(), n, MPI_BYTE, peer, tag, comm_, r);
                 });
  }

  Work do_barrier(Millis timeout) override {
    return start(describe("barrier"), timeout, {},
                 [&](MPI_Request* r, Payload&) { return MPI_Ibarrier(comm_, r); });
  }

  // The colours travel first through a timed all_gather, so a rank that never arrives makes
  // the others fail instead of blocking in MPI_Comm_split, which has no timeout.
  std::unique_ptr<Communicator> do_split(int color, int key, Millis timeout) override {
    if (std::exception_ptr e = health_->get()) std::rethrow_exception(e);
    SplitPlan plan = exchange_split(*this, color, key, timeout);
    MPI_Comm sub = MPI_COMM_NULL;
    {
      auto lock = MpiRuntime::get().lock();
      WEFT_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
    }
    if (sub == MPI_COMM_NULL) return nullptr;
    int sub_rank = -1, sub_size = 0;
    {
      auto lock = MpiRuntime::get().lock();
      MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
      MPI_Comm_rank(sub, &sub_rank);
      MPI_Comm_size(sub, &sub_size);
    }
    WEFT_CHECK(sub_rank == plan.rank && sub_size == int(plan.members.size()),
               "mpi split: MPI placed rank ", rank(), " at ", sub_rank, "/", sub_size,
               ", the plan at ", plan.rank, "/", plan.members.size());
    return std::make_unique<MpiCommunicator>(sub, sub_rank, sub_size, this->timeout());
  }

  void do_abort(const std::string&) noexcept override { health_->set(failure()); }

 private:
  template <typename StartFn>
  Work start(std::string what, Millis timeout, std::vector<core::Tensor> tensors, StartFn&& fn,
             std::function<void()> finish = nullptr) {
    if (std::exception_ptr e = health_->get()) return Work::failed(e);
    auto payload = std::make_unique<Payload>();
    payload->tensors = std::move(tensors);
    Payload& p = *payload;
    auto work = std::make_shared<MpiWork>(health_, std::move(what), timeout, std::move(payload),
                                          std::move(finish));
    {
      auto lock = MpiRuntime::get().lock();
      WEFT_MPI_CHECK(fn(work->request(), p));
    }
    return Work(work);
  }

  MPI_Comm comm_;
  std::shared_ptr<Health> health_;
};

// Polls MPI_Comm_idup so that a rank that never joins makes the others time out.
MPI_Comm dup_world(Millis timeout) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  {
    auto lock = MpiRuntime::get().lock();
    WEFT_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &req));
  }
  const auto expires = Clock::now() + timeout;
  for (int flag = 0;;) {
    {
      auto lock = MpiRuntime::get().lock();
      WEFT_MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
    }
    if (flag) break;
    if (Clock::now() >= expires)
      throw TimeoutError(str("mpi: duplicating MPI_COMM_WORLD timed out after ", timeout.count(),
                             " ms: not every rank created the communicator"));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  auto lock = MpiRuntime::get().lock();
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return comm;
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& opts) {
  MpiRuntime::get();
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  WEFT_CHECK(opts.rank == -1 || opts.rank == rank, "mpi: CommOptions::rank is ", opts.rank,
             " but MPI says ", rank, " (pass -1 to take MPI's)");
  WEFT_CHECK(opts.size == -1 || opts.size == size, "mpi: CommOptions::size is ", opts.size,
             " but MPI says ", size, " (pass -1 to take MPI's)");
  return std::make_unique<MpiCommunicator>(dup_world(opts.timeout), rank, size, opts.timeout);
}

}  // namespace weft::comm
