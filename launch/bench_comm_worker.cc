// The rank side of `weft bench comm`: one process per rank (spawned by the driver for Gloo,
// by mpirun for MPI) times the collectives and rank 0 prints one JSON line per sample.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>

#include "base/check.h"
#include "base/config.h"
#include "base/error.h"
#include "comm/communicator.h"
#include "comm/reduce.h"
#include "comm/registry.h"
#include "comm/store/tcp_store.h"
#include "launch/bench_comm.h"
#include "launch/bench_util.h"

#if WEFT_HAVE_GLOO
#include <gloo/allreduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "comm/gloo/gloo_store.h"
#endif

namespace weft::launch {
namespace {

using Clock = std::chrono::steady_clock;
using core::DType;
using core::Tensor;

std::vector<int64_t> parse_sizes(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

// Times `iters` calls of `op` after `warmup` untimed ones, each behind a barrier so every rank
// starts together, and returns the median over iterations of the slowest rank's time (the
// collective is only as fast as its last rank; the median keeps a descheduled iteration on a
// shared machine from deciding the row).
double time_op(comm::Communicator& c, int warmup, int iters, const std::function<void()>& op) {
  for (int i = 0; i < warmup; ++i) op();
  Tensor times = Tensor::zeros({iters}, DType::kF64);
  for (int i = 0; i < iters; ++i) {
    c.barrier().wait();
    auto t0 = Clock::now();
    op();
    times.data<double>()[i] = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  c.all_reduce(times, {comm::ReduceOp::kMax}).wait();
  return median(std::vector<double>(times.data<double>(), times.data<double>() + iters));
}

void report(const comm::Communicator& c, const CommSample& s) {
  if (c.rank() != 0) return;
  std::printf("{\"op\": \"%s\", \"bytes\": %lld, \"seconds\": %.9g, \"iters\": %d}\n", s.op.c_str(),
              (long long)s.bytes, s.seconds, s.iters);
  std::fflush(stdout);  // the driver reads lines as they come
}

int warmup_for(int64_t bytes) { return bytes >= (int64_t(16) << 20) ? 1 : 3; }

// A number is only worth printing if the bytes arrived: the first warm-up of each size runs on
// known values (rank r contributes r + 1 everywhere) and is checked element by element.
void check_all(const Tensor& t, int64_t from, int64_t count, float want, const char* what) {
  const float* p = t.data<float>();
  for (int64_t i = from; i < from + count; ++i)
    WEFT_ENSURE(p[i] == want, InternalError, "bench comm: ", what, " element ", i, " is ", p[i],
                ", expected ", want);
}

// all_reduce on `bytes` of f32, all_gather with `bytes` of output (nccl-tests' convention:
// the size is the gathered buffer, each rank contributes bytes / n). With `spin`, a call is
// finished by polling Work::done() instead of blocking in Work::wait(): for MPI that is the
// progress engine running flat out, which shows what the backend's wait backoff costs.
void sweep_collectives(comm::Communicator& c, const std::vector<int64_t>& sizes, bool quick,
                       bool spin) {
  const int n = c.size();
  const float mine = float(c.rank() + 1);
  auto finish = [spin](const comm::Work& w) {
    if (spin)
      while (!w.done()) {
      }
    w.wait();
  };
  for (int64_t bytes : sizes) {
    const int iters = iterations_for(bytes, quick);
    Tensor t = Tensor::empty({bytes / 4}, DType::kF32);
    t.fill_(mine);
    finish(c.all_reduce(t));
    check_all(t, 0, t.numel(), float(n * (n + 1) / 2), "all_reduce");
    double s = time_op(c, warmup_for(bytes) - 1, iters, [&] { finish(c.all_reduce(t)); });
    report(c, {"all_reduce", bytes, s, iters});
  }
  for (int64_t bytes : sizes) {
    const int iters = iterations_for(bytes, quick);
    const int64_t per_rank = bytes / 4 / n;
    Tensor in = Tensor::empty({per_rank}, DType::kF32);
    in.fill_(mine);
    Tensor out = Tensor::zeros({per_rank * n}, DType::kF32);
    finish(c.all_gather(out, in));
    for (int r = 0; r < n; ++r) check_all(out, r * per_rank, per_rank, float(r + 1), "all_gather");
    double s = time_op(c, warmup_for(bytes) - 1, iters, [&] { finish(c.all_gather(out, in)); });
    report(c, {"all_gather", per_rank * n * 4, s, iters});
  }
}

#if WEFT_HAVE_GLOO
// The communicator picks bcube or ring by size itself, so to find where one overtakes the other
// this drives both of Gloo's algorithms directly on a context of their own, over the same TCP
// transport and with the same reduce function as comm/gloo/gloo_communicator.cc. Iterations
// alternate between the two so that noise on a shared machine falls on both alike.
void probe_gloo_allreduce(comm::Communicator& c, comm::Store& store, const Args& a,
                          const std::vector<int64_t>& sizes, bool quick) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(c.rank(), c.size());
  context->setTimeout(c.timeout());
  comm::GlooStore gstore(store, a.get("--prefix") + "/probe", c.size());
  context->connectFullMesh(gstore, device);
  uint32_t tag = 0;
  auto run = [&](Tensor& t, gloo::AllreduceOptions::Algorithm alg) {
    gloo::AllreduceOptions o(context);
    o.setOutput(t.data<float>(), size_t(t.numel()));
    o.setReduceFunction([](void* out, const void* x, const void* y, size_t n) {
      comm::reduce_elements(out, x, y, n, DType::kF32, comm::ReduceOp::kSum);
    });
    o.setAlgorithm(alg);
    o.setTag(tag++);
    o.setTimeout(c.timeout());
    gloo::allreduce(o);
  };
  using Alg = gloo::AllreduceOptions::Algorithm;
  for (int64_t bytes : sizes) {
    const int iters = iterations_for(bytes, quick);
    Tensor t = Tensor::zeros({bytes / 4}, DType::kF32);
    for (Alg alg : {Alg::BCUBE, Alg::RING}) {
      t.fill_(float(c.rank() + 1));
      run(t, alg);
      check_all(t, 0, t.numel(), float(c.size() * (c.size() + 1) / 2), "gloo probe all-reduce");
    }
    for (int i = 1; i < warmup_for(bytes); ++i) run(t, Alg::BCUBE), run(t, Alg::RING);
    Tensor times = Tensor::zeros({2, iters}, DType::kF64);
    double* tm = times.data<double>();
    for (int i = 0; i < iters; ++i) {
      for (int k = 0; k < 2; ++k) {
        c.barrier().wait();
        auto t0 = Clock::now();
        run(t, k == 0 ? Alg::BCUBE : Alg::RING);
        tm[k * iters + i] = std::chrono::duration<double>(Clock::now() - t0).count();
      }
    }
    c.all_reduce(times, {comm::ReduceOp::kMax}).wait();
    for (int k = 0; k < 2; ++k) {
      double med = median(std::vector<double>(tm + k * iters, tm + (k + 1) * iters));
      report(c, {k == 0 ? "gloo_bcube" : "gloo_ring", bytes, med, iters});
    }
  }
}
#endif

}  // namespace

int iterations_for(int64_t bytes, bool quick) {
  // 40 up to 256 KiB, then 40 * sqrt(256 KiB / bytes): 20 at 1 MiB, 5 at 16 MiB, 2 at 256 MiB.
  double it = 40.0 * std::sqrt(double(256 << 10) / double(std::max<int64_t>(bytes, 1)));
  int n = int(std::lround(std::clamp(it, 2.0, 40.0)));
  return quick ? std::min(n, 5) : n;
}

std::string size_label(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) bytes /= 1024, ++u;
  return std::to_string(bytes) + " " + units[u];
}

int run_comm_worker(const Args& a, bool mpi) {
  const bool quick = a.flag("--quick");
  const std::vector<int64_t> sizes = parse_sizes(a.get("--sizes"));
  comm::CommOptions opts;
  opts.timeout = comm::Millis(a.get_int("--timeout-ms", 120'000));
  std::unique_ptr<comm::Store> store;
  if (!mpi) {
    opts.rank = int(a.get_int("--rank", -1));
    opts.size = int(a.get_int("--world", -1));
    store = std::make_unique<comm::TCPStore>("127.0.0.1", uint16_t(a.get_int("--port", 0)),
                                             opts.timeout);
    opts.store = store.get();
    opts.prefix = a.get("--prefix");
  }
  auto c = comm::make_communicator(mpi ? comm::BackendKind::kMpi : comm::BackendKind::kGloo, opts);
  sweep_collectives(*c, sizes, quick, a.flag("--spin"));
#if WEFT_HAVE_GLOO
  if (!mpi && a.has("--probe-sizes"))
    probe_gloo_allreduce(*c, *store, a, parse_sizes(a.get("--probe-sizes")), quick);
#endif
  c->barrier().wait();  // nobody tears its connections down while a peer still reads
  return 0;
}

}  // namespace weft::launch
