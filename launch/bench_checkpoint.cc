// `weft bench checkpoint`: every number beside the bound this machine sets in the same run:
// save/load against raw sequential disk I/O, async/sync save against no save, and the
// router's resharding against the bytes it must move and memcpy.
#include "launch/bench_checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/job_id.h"
#include "checkpoint/trainer_state.h"
#include "comm/registry.h"
#include "comm/store/in_memory_store.h"
#include "core/cpu/kernels.h"
#include "core/exec/trainer.h"
#include "core/rng.h"
#include "launch/args.h"
#include "memory/host_allocator.h"
#include "parallel/router.h"
#include "parallel/shm_channel.h"
#include "parallel/vps.h"
#include "planner/planner.h"

namespace weft::launch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  throw IoError("bench checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

// Drops the page cache of one file: fsync first, since DONTNEED leaves dirty pages alone.
void drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) io_fail("open", path);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_cache_tree(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) drop_cache(e.path().string());
}

// Fraction of the file's pages in the page cache (mincore): shows whether the drop took.
double cached_fraction(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) io_fail("open", path);
  struct stat st {};
  ::fstat(fd, &st);
  size_t len = size_t(st.st_size), page = size_t(::sysconf(_SC_PAGESIZE));
  void* p = len ? ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  std::vector<unsigned char> vec((len + page - 1) / page);
  double frac = -1;
  if (::mincore(p, len, vec.data()) == 0) {
    size_t in = 0;
    for (unsigned char c : vec) in += c & 1;
    frac = double(in) / double(vec.size());
  }
  ::munmap(p, len);
  return frac;
}

struct RawDisk {
  double write_s = 0, read_s = 0, cached_after_drop = -1;
};

// Sequential write of `bytes` in 8 MiB writes, then fsync (timed together); drop the file's
// cache; sequential read. What the kernel's page cache does not hide: the device's rate.
RawDisk raw_disk(const std::string& dir, int64_t bytes) {
  const std::string path = dir + "/raw.bin";
  const size_t chunk = size_t(8) << 20;
  std::vector<char> buf(chunk, 0x5a);
  RawDisk r;
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) io_fail("open", path);
  for (int64_t done = 0; done < bytes;) {
    size_t n = size_t(std::min<int64_t>(int64_t(chunk), bytes - done));
    ssize_t w = ::write(fd, buf.data(), n);
    if (w <= 0) io_fail("write", path);
    done += w;
  }
  if (::fsync(fd) != 0) io_fail("fsync", path);
  ::close(fd);
  r.write_s = since(t0);
  drop_cache(path);
  r.cached_after_drop = cached_fraction(path);
  t0 = Clock::now();
  fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) io_fail("open", path);
  while (::read(fd, buf.data(), chunk) > 0) {
  }
  ::close(fd);
  r.read_s = since(t0);
  fs::remove(path);
  return r;
}

// The same with O_DIRECT (4 KiB-aligned 8 MiB buffers, `bytes` rounded up to 8 MiB): the
// device without the page cache's copies. Returns false where the filesystem refuses
// O_DIRECT (tmpfs).
bool raw_disk_direct(const std::string& dir, int64_t bytes, RawDisk& r) {
  const std::string path = dir + "/raw-direct.bin";
  const size_t chunk = size_t(8) << 20;
  void* mem = nullptr;
  if (::posix_memalign(&mem, 4096, chunk) != 0) return false;
  std::unique_ptr<void, void (*)(void*)> hold(mem, std::free);
  std::memset(mem, 0x5a, chunk);
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) return false;
  for (int64_t done = 0; done < bytes; done += int64_t(chunk))
    if (::write(fd, mem, chunk) != ssize_t(chunk)) {
      ::close(fd);
      fs::remove(path);
      return false;
    }
  ::fsync(fd);
  ::close(fd);
  r.write_s = since(t0);
  t0 = Clock::now();
  fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return false;
  while (::read(fd, mem, chunk) > 0) {
  }
  ::close(fd);
  r.read_s = since(t0);
  fs::remove(path);
  return true;
}

int64_t tree_bytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += int64_t(e.file_size());
  return n;
}

core::JobSpec gpt(int64_t layers, int64_t dim, int64_t heads, int64_t vocab, int64_t seq,
                  int64_t batch) {
  core::JobSpec s;
  s.model.layers = layers, s.model.dim = dim, s.model.heads = heads, s.model.vocab = vocab;
  s.model.seq_len = seq;
  s.train.global_batch = s.train.micro_batch = batch;
  s.train.lr = 1e-4;
  return s;
}

std::string shape_str(const core::JobSpec& s) {
  char b[128];
  std::snprintf(b, sizeof b, "GPT %lldx%lld, vocab %lld", (long long)s.model.layers,
                (long long)s.model.dim, (long long)s.model.vocab);
  return b;
}

int64_t state_bytes(const parallel::StateSpace& space) {
  int64_t n = 0;
  for (const auto& t : space.tensors())
    n += core::shape_numel(t.shape) * int64_t(core::dtype_size(t.dtype));
  return n;
}

int64_t param_count(const parallel::StateSpace& space) {
  int64_t n = 0;
  for (const auto& t : space.tensors())
    if (t.kind == parallel::StateKind::kParameter) n += core::shape_numel(t.shape);
  return n;
}

void touch(std::vector<core::Tensor>& ts, int byte) {
  for (core::Tensor& t : ts) std::memset(t.raw_data(), byte, t.nbytes());
}

// Bytes per second of one thread's memcpy between two buffers of `bytes`, best of 5.
double memcpy_bps(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(best, since(t0));
  }
  volatile char sink = dst[bytes / 2];
  (void)sink;
  return double(bytes) / best;
}

// The same into memory never touched before, each pass a new allocation (best of 3): what a
// copy into a freshly allocated tensor pays in page faults, the bound for a transition that
// allocates its destination.
double memcpy_fresh_bps(size_t bytes) {
  std::vector<char> src(bytes, 1);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    std::unique_ptr<char, void (*)(void*)> dst(static_cast<char*>(std::malloc(bytes)), std::free);
    if (!dst) throw std::bad_alloc();
    auto t0 = Clock::now();
    std::memcpy(dst.get(), src.data(), bytes);
    best = std::min(best, since(t0));
    volatile char sink = dst.get()[bytes / 2];
    (void)sink;
  }
  return double(bytes) / best;
}

void row(const char* what, int64_t bytes, double secs, double ref_bps) {
  double bps = double(bytes) / secs;
  std::printf("%-34s %10.1f %9.4g %9.4g", what, double(bytes) / double(1 << 20), secs, bps / 1e9);
  if (ref_bps > 0)
    std::printf(" %8.3g\n", bps / ref_bps);
  else
    std::printf(" %8s\n", "-");
}

// ---- save / load against raw disk ----------------------------------------------------------

void bench_disk(const std::string& dir, const core::JobSpec& spec, int reps) {
  core::ModelGraph mg = planner::build_planning_graph(spec);
  parallel::StateSpace space = parallel::StateSpace::from_graph(mg.graph);
  parallel::Layout layout = parallel::whole_layout(space);
  std::vector<core::Tensor> held = parallel::allocate_locals(layout.ranks[0]);
  for (core::Tensor& t : held)
    if (t.dtype() == core::DType::kF32) {
      float* p = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(i % 1000) * 1e-3f;
    }
  const int64_t bytes = state_bytes(space);

  std::vector<double> rw, rr, sv, ld, dw, dr;
  double cached = -1;
  int64_t saved = 0, loaded = 0;
  const std::string root = dir + "/ckpt";
  const std::string job = checkpoint::new_job_id();  // one job: keep 1 removes the last rep's
  for (int i = 0; i < reps; ++i) {
    RawDisk r = raw_disk(dir, bytes);
    rw.push_back(r.write_s), rr.push_back(r.read_s), cached = r.cached_after_drop;
    if (raw_disk_direct(dir, bytes, r)) dw.push_back(r.write_s), dr.push_back(r.read_s);

    checkpoint::CheckpointInfo info{&spec, i + 1, "bench (whole state on rank 0)", job};
    auto t0 = Clock::now();
    std::string step = checkpoint::save_checkpoint(root, info, space, layout,
                                                   checkpoint::HeldState{{0}, {held}}, 1);
    sv.push_back(since(t0));
    saved = tree_bytes(step);
    drop_cache_tree(step);
    std::vector<core::Tensor> fresh = parallel::allocate_locals(layout.ranks[0]);
    touch(fresh, 0);  // page faults are not the disk's
    t0 = Clock::now();
    checkpoint::Metadata m = checkpoint::read_metadata(step, "bench");
    loaded = checkpoint::load_checkpoint(step, m, space, layout, 0, fresh, "bench");
    ld.push_back(since(t0));
  }
  fs::remove_all(root);

  // "vs raw" is against the faster raw path of each direction: the device's ceiling.
  const int64_t direct = (bytes + (int64_t(8) << 20) - 1) / (int64_t(8) << 20) * (int64_t(8) << 20);
  double wbps = double(bytes) / median(rw), rbps = double(bytes) / median(rr);
  if (!dw.empty()) {
    wbps = std::max(wbps, double(direct) / median(dw));
    rbps = std::max(rbps, double(direct) / median(dr));
  }
  std::printf(
      "\n== disk: %s, %s (%.1f M params, fp32 + Adam m, v), median of %d\n"
      "   raw = 8 MiB write()s + fsync, then posix_fadvise(DONTNEED) and 8 MiB read()s, the "
      "page cache's path as\n   checkpoints take it, and the same with O_DIRECT (the device "
      "alone); \"vs raw\" is against the faster of the two;\n   page cache left after the "
      "drop: %.0f%%; the checkpoint's files get the same drop before the load\n",
      dir.c_str(), shape_str(spec).c_str(), double(param_count(space)) / 1e6, reps, cached * 100);
  std::printf("%-34s %10s %9s %9s %8s\n", "what", "MiB", "seconds", "GB/s", "vs raw");
  row("raw sequential write (fsync)", bytes, median(rw), 0);
  row("raw sequential read (cold)", bytes, median(rr), 0);
  if (!dw.empty()) {
    row("raw sequential write (O_DIRECT)", direct, median(dw), 0);
    row("raw sequential read (O_DIRECT)", direct, median(dr), 0);
  }
  row("checkpoint save (sync, fsync)", saved, median(sv), wbps);
  row("checkpoint load (cold)", loaded, median(ld), rbps);
  std::fflush(stdout);  // a section at a time, for whoever watches a long run
}

// ---- step time: none / sync / async ---------------------------------------------------------

// One trainer per mode, all alive at once, so that the modes can take turns.
struct ModeRun {
  std::string mode;
  core::JobSpec spec;
  memory::HostAllocator act;
  std::unique_ptr<core::Trainer> trainer;
  std::unique_ptr<checkpoint::TrainerCheckpoints> ckpt;
  std::vector<double> step_s, save_s;
};

void bench_steps(const std::string& dir, const core::JobSpec& spec, int steps, int threads) {
  parallel::StateSpace space =
      parallel::StateSpace::from_graph(planner::build_planning_graph(spec).graph);
  const int block = std::min(steps, 3);
  std::printf(
      "\n== step time: %s, seq %lld, batch %lld, %d threads; a checkpoint after every step "
      "(%.1f MiB),\n   median of %d steps; the modes take turns in blocks of %d steps (load "
      "from elsewhere hits all three),\n   the async save still writing at a block's end is "
      "waited for outside the timing\n",
      shape_str(spec).c_str(), (long long)spec.model.seq_len, (long long)spec.train.global_batch,
      threads, double(state_bytes(space)) / (1 << 20), steps, block);
  std::vector<std::unique_ptr<ModeRun>> runs;
  core::CounterRng rng(1, 2);
  const int64_t T = spec.model.seq_len, V = spec.model.vocab, B = spec.train.global_batch;
  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    for (int64_t i = 0; i < n * T; ++i) {
      uint64_t k = uint64_t((s * B + b0) * T + i) * 2;
      x[i] = int32_t(rng.u32(k) % uint32_t(V));
      y[i] = int32_t(rng.u32(k + 1) % uint32_t(V));
    }
  };
  for (const char* mode : {"none", "sync", "async"}) {
    auto r = std::make_unique<ModeRun>();
    r->mode = mode;
    r->spec = spec;
    r->spec.train.threads = threads;
    const bool none = r->mode == "none";
    r->spec.checkpoint.dir = none ? "" : dir + "/steps-" + mode;
    r->spec.checkpoint.every = none ? 0 : 1;
    r->spec.checkpoint.async = r->mode == "async";
    r->spec.checkpoint.keep = 2;
    r->trainer = std::make_unique<core::Trainer>(r->spec, core::DType::kF32, &r->act);
    r->ckpt = std::make_unique<checkpoint::TrainerCheckpoints>(r->spec, *r->trainer);
    r->trainer->step(batch);  // warm-up: first touch of every buffer, not saved
    runs.push_back(std::move(r));
  }
  for (int done = 0; done < steps; done += block)
    for (auto& r : runs) {
      for (int i = done; i < std::min(steps, done + block); ++i) {
        auto t0 = Clock::now();
        r->trainer->step(batch);
        auto t1 = Clock::now();
        r->ckpt->after_step();
        r->save_s.push_back(since(t1));
        r->step_s.push_back(since(t0));
      }
      r->ckpt->finish();
    }
  std::printf("%-34s %10s %10s %10s %9s\n", "mode", "step ms", "save ms", "over ms", "over %");
  const double base = median(runs[0]->step_s);
  for (auto& r : runs) {
    const double t = median(r->step_s);
    std::printf("%-34s %10.2f %10.2f %10.2f %9.1f\n", ("save " + r->mode).c_str(), t * 1e3,
                median(r->save_s) * 1e3, (t - base) * 1e3,
                base > 0 ? (t - base) / base * 100 : 0.0);
    if (!r->spec.checkpoint.dir.empty()) fs::remove_all(r->spec.checkpoint.dir);
  }
  std::fflush(stdout);
}

// ---- resharding in memory ------------------------------------------------------------------

parallel::Layout layout_for(core::JobSpec s, const parallel::StateSpace& space, int64_t dp,
                            int64_t tp, int64_t zero) {
  s.parallel.dp = dp, s.parallel.tp = tp, s.parallel.zero = zero;
  planner::PlanOptions o;
  o.simulate = false;
  return parallel::layout_of(space, planner::make_plan(s, int(dp * tp), o));
}

struct ReshardRun {
  double secs = 0;                  // slowest rank, between two barriers
  parallel::TransitionStats total;  // summed over the ranks
  std::vector<int64_t> held_peak;   // per rank: the router's count (TransitionStats)
};

// Four ranks as threads of this process, each with its own Gloo communicator over 127.0.0.1
// (a shared in-memory store): real sends, no fork of a threaded process. Fresh sources each
// run; the destinations are dropped before the next.
ReshardRun run_reshard(const parallel::TransferPlan& plan, const parallel::Layout& a,
                       const parallel::Layout& b, bool shared_memory, const std::string& prefix) {
  const int world = a.world();
  comm::InMemoryStore store(std::chrono::milliseconds(300'000));
  std::vector<double> secs(static_cast<size_t>(world), 0.0);
  std::vector<parallel::TransitionStats> stats(static_cast<size_t>(world));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        comm::CommOptions o;
        o.rank = r, o.size = world, o.store = &store, o.prefix = prefix;
        o.timeout = std::chrono::milliseconds(300'000);
        auto c = comm::make_communicator(comm::BackendKind::kGloo, o);
        std::vector<core::Tensor> src = parallel::allocate_locals(a.ranks[size_t(r)]);
        touch(src, 0x11);
        parallel::TransitionOptions opt;
        opt.shared_memory = shared_memory;
        c->barrier().wait();
        auto t0 = Clock::now();
        std::vector<core::Tensor> dst =
            parallel::run_transition(plan, a, b, r, src, *c, opt, &stats[size_t(r)]);
        c->barrier().wait();
        secs[size_t(r)] = since(t0);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  ReshardRun run;
  run.secs = *std::max_element(secs.begin(), secs.end());
  for (const parallel::TransitionStats& st : stats) {
    run.held_peak.push_back(st.bytes_held_peak);
    run.total.bytes_adopted += st.bytes_adopted, run.total.bytes_copied += st.bytes_copied;
    run.total.bytes_sent_shm += st.bytes_sent_shm, run.total.bytes_sent_comm += st.bytes_sent_comm;
    run.total.bytes_received_shm += st.bytes_received_shm;
    run.total.bytes_received_comm += st.bytes_received_comm;
  }
  return run;
}

// The shared-memory channel alone: rank 0 sends rank 1 one message of `bytes` from and
// into memory already touched (threads of this process), best of 3. What the transport
// costs once page faults of fresh destinations are out of the way.
double shm_channel_bps(int64_t bytes) {
  comm::InMemoryStore store(std::chrono::milliseconds(60'000));
  std::vector<char> from(size_t(bytes), 1), to(size_t(bytes), 2);
  std::vector<double> best(2, 1e30);
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        comm::CommOptions o;
        o.rank = r, o.size = 2, o.store = &store, o.prefix = "ckbench-channel";
        o.timeout = std::chrono::milliseconds(60'000);
        auto c = comm::make_communicator(comm::BackendKind::kGloo, o);
        parallel::ShmTransport shm(*c, {0, bytes, 0, 0});
        if (!shm.usable(0, 1)) throw CommError("bench checkpoint: no shared-memory channel");
        parallel::ShmTransport::Send send{1, bytes, [&](int64_t at, char* out, int64_t n) {
                                            std::memcpy(out, from.data() + at, size_t(n));
                                          }};
        parallel::ShmTransport::Recv recv{0, bytes, [&](int64_t at, const char* in, int64_t n) {
                                            std::memcpy(to.data() + at, in, size_t(n));
                                          }};
        for (int i = 0; i < 3; ++i) {
          c->barrier().wait();
          auto t0 = Clock::now();
          shm.exchange(r == 0 ? &send : nullptr, r == 1 ? &recv : nullptr);
          c->barrier().wait();
          best[size_t(r)] = std::min(best[size_t(r)], since(t0));
        }
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return double(bytes) / std::max(best[0], best[1]);
}

void bench_reshard(const core::JobSpec& spec, int64_t budget, int64_t channel_bytes) {
  core::ModelGraph mg = planner::build_planning_graph(spec);
  parallel::StateSpace space = parallel::StateSpace::from_graph(mg.graph);
  // dp4 with ZeRO-1 (moments sharded): four full replicas of a 4.2 GB state would not fit
  // beside the destination in this machine's memory. All four ranks on one host, so the
  // plan is the same for both transports and only the transport differs between the runs.
  parallel::Layout a = layout_for(spec, space, 4, 1, 1);
  parallel::Layout b = layout_for(spec, space, 2, 2, 0);
  a.hosts = b.hosts = std::vector<int>(size_t(a.world()), 0);
  parallel::RouterOptions opt;
  opt.budget_bytes = budget;
  auto tp0 = Clock::now();
  const parallel::TransferPlan plan = parallel::transition(space, a, b, opt);
  const double plan_s = since(tp0);
  int64_t local_bytes = 0;
  for (const auto& t : plan.transfers)
    if (t.local()) local_bytes += t.bytes;
  const int64_t remote = plan.bytes_remote();

  const ReshardRun gloo = run_reshard(plan, a, b, false, "ckbench-gloo");
  const ReshardRun shm = run_reshard(plan, a, b, true, "ckbench-shm");
  const double mbps = memcpy_bps(size_t(256) << 20);
  const double fresh_bps = memcpy_fresh_bps(size_t(256) << 20);
  const double channel_bps = shm_channel_bps(channel_bytes);
  int64_t a_bytes = 0, b_bytes = 0;
  for (const auto& rl : a.ranks)
    for (const auto& l : rl.locals) a_bytes += l.bytes();
  for (const auto& rl : b.ranks)
    for (const auto& l : rl.locals) b_bytes += l.bytes();

  std::printf(
      "\n== reshard: %s (%.1f M params, fp32 + Adam m, v = %.3f GB), dp4 ZeRO-1 -> tp2 x dp2,\n"
      "   router only (no disk): 4 ranks as threads of one host, one Gloo communicator each "
      "over 127.0.0.1, budget %lld KiB;\n   %zu transfers in %zu waves, %d rounds, planned in "
      "%.2f s; held before %.3f GB, after %.3f GB (all ranks);\n   the same plan twice: every "
      "message through Gloo, then through shared memory (same host)\n",
      shape_str(spec).c_str(), double(param_count(space)) / 1e6, double(state_bytes(space)) / 1e9,
      (long long)(budget >> 10), plan.transfers.size(), plan.waves.size(), plan.rounds(), plan_s,
      double(a_bytes) / 1e9, double(b_bytes) / 1e9);
  std::printf("%-34s %10s %9s %9s %8s\n", "what", "MiB", "seconds", "GB/s", "vs memcpy");
  row("memcpy (1 thread, 256 MiB)", int64_t(256) << 20, double(int64_t(256) << 20) / mbps, 0);
  row("memcpy into fresh memory", int64_t(256) << 20, double(int64_t(256) << 20) / fresh_bps, mbps);
  row("reshard gloo: bytes between ranks", remote, gloo.secs, mbps);
  row("reshard shm: bytes between ranks", remote, shm.secs, mbps);
  row("reshard gloo: all bytes (+ local)", remote + local_bytes, gloo.secs, mbps);
  row("reshard shm: all bytes (+ local)", remote + local_bytes, shm.secs, mbps);
  row("shm channel, 2 ranks, warm memory", channel_bytes, double(channel_bytes) / channel_bps,
      mbps);
  std::printf("%-34s %10.1f %9.4g %9.4g %8s\n", "memcpy bound (all bytes, 1 copy)",
              double(remote + local_bytes) / double(1 << 20), double(remote + local_bytes) / mbps,
              mbps / 1e9, "1.00");
  std::printf("%-34s %10.3g\n", "shm speed-up over gloo (x)", gloo.secs / shm.secs);
  std::printf("%-34s %10.3g\n", "shm all bytes vs fresh memcpy",
              double(remote + local_bytes) / shm.secs / fresh_bps);
  // What moved against the minimum: the plan's bytes between ranks, and no local copy of a
  // tensor that can be adopted.
  const parallel::TransitionStats& t = shm.total;
  std::printf(
      "   moved (shm run, MiB): %.1f via shared memory + %.1f via Gloo between ranks (minimum "
      "%.1f),\n   %.1f copied locally, %.1f adopted without a copy\n",
      double(t.bytes_sent_shm) / double(1 << 20), double(t.bytes_sent_comm) / double(1 << 20),
      double(remote) / double(1 << 20), double(t.bytes_copied) / double(1 << 20),
      double(t.bytes_adopted) / double(1 << 20));
  // Memory per rank: the router's count of the tensors it held (sources until their last read,
  // destinations from their first write, staging) against the larger of the rank's two
  // holdings plus the budget.
  std::printf(
      "   peak per rank (router's count, MiB; the Gloo run / the shm run / the larger holding"
      " + budget):\n  ");
  for (int r = 0; r < a.world(); ++r) {
    const parallel::RankMemory m = parallel::rank_memory(plan, a, b, r);
    std::printf(" r%d %.1f / %.1f / %.1f%s", r, double(gloo.held_peak[size_t(r)]) / (1 << 20),
                double(shm.held_peak[size_t(r)]) / (1 << 20), double(m.bound(budget)) / (1 << 20),
                r + 1 < a.world() ? ";" : "\n");
  }
  std::fflush(stdout);  // a section at a time, for whoever watches a long run
}

}  // namespace

int run_checkpoint_bench(const std::vector<std::string>& argv) {
  Args a(argv, {"--dir", "--threads", "--steps", "--parts"}, {"--quick"});
  const std::string parts = "," + a.get_or("--parts", "reshard,disk,steps") + ",";
  auto part = [&](const char* p) {
    std::string key = ",";  // not "," + string: GCC 12 warns -Wrestrict on it
    key += p;
    key += ",";
    return parts.find(key) != std::string::npos;
  };
  if (!part("reshard") && !part("disk") && !part("steps"))
    throw ConfigError("--parts", "expected a comma-separated subset of reshard,disk,steps");
  const bool quick = a.flag("--quick");
  const int threads =
      int(a.get_int("--threads", std::min(2u, std::thread::hardware_concurrency())));
  const int steps = int(a.get_int("--steps", quick ? 3 : 15));
  if (threads < 1 || steps < 1)
    throw ConfigError("--steps", "--threads and --steps must be at least 1");
  std::string base = a.get_or("--dir", "");
  if (base.empty()) {
    const char* t = std::getenv("TMPDIR");
    base = t && *t ? t : "/tmp";
  }
  std::string tmpl = base + "/weft-ckbench-XXXXXX";
  if (!::mkdtemp(tmpl.data())) io_fail("mkdtemp", tmpl);
  const std::string dir = tmpl;
  core::cpu::set_num_threads(threads);
  // Other work on the machine skews every row; say how much there was.
  double load = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  std::printf("weft bench checkpoint: %u cpus, load average %.2f (1 min) at start, scratch %s\n",
              std::thread::hardware_concurrency(), load, dir.c_str());
  try {
    // Resharding first: its four ranks want the most memory, before the trainer's buffers.
    // Micro-batch 2 so that a global batch of 8 splits four ways.
    core::JobSpec big = quick ? gpt(2, 64, 4, 256, 16, 8) : gpt(24, 1024, 16, 50304, 1024, 8);
    big.train.micro_batch = 2;
    if (part("reshard"))
      bench_reshard(big, quick ? int64_t(1) << 16 : int64_t(512) << 20,
                    quick ? int64_t(16) << 20 : int64_t(1) << 30);
    if (part("disk"))
      bench_disk(dir, quick ? gpt(2, 64, 4, 256, 16, 2) : gpt(12, 768, 12, 50304, 256, 4),
                 quick ? 1 : 3);
    if (part("steps"))
      bench_steps(dir, quick ? gpt(2, 64, 4, 256, 32, 2) : gpt(4, 256, 4, 256, 64, 4), steps,
                  threads);
  } catch (...) {
    fs::remove_all(dir);
    throw;
  }
  fs::remove_all(dir);
  return 0;
}

}  // namespace weft::launch
