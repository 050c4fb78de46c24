// `weft bench snapshot`: options and dispatch, and the parts that run in this process alone.
// encode: Reed-Solomon encode and the rebuild of one lost data fragment for (k, m) = (2, 1)
// and (4, 2), crc32c, and memcpy into already-touched memory (the copy a snapshot makes);
// the copy rates the overhead part sets its numbers beside (measure_copy_rates). The parts
// that train (overhead, recovery) are launch/bench_snapshot_{overhead,recovery}.cc.
#include "launch/bench_snapshot.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/erasure_code.h"
#include "checkpoint/snapshot_segment.h"
#include "checkpoint/snapshot_writer.h"
#include "core/tensor.h"
#include "launch/args.h"
#include "launch/bench_elastic_parts.h"
#include "launch/bench_snapshot_parts.h"

namespace weft::launch::snapbench {

void progress(const std::string& what) {
  std::fprintf(stderr, "[bench snapshot] %s\n", what.c_str());
  std::fflush(stderr);
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  if (!(in >> a >> b >> c)) return "load average unknown";
  return "load average " + a + " " + b + " " + c;
}

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kReps = 3;                  // each number is the median of these
constexpr double kEncodeTargetBps = 5e9;  // the issue's: encode >= 5 GB/s per core
constexpr int64_t kDefaultMib = 256;
volatile uint32_t g_sink;  // where checksums go so that computing them is not optimized out

// A page-aligned buffer whose every page has been written (no first-touch faults in a timing).
class Buffer {
 public:
  explicit Buffer(size_t bytes)
      : bytes_(bytes), p_(static_cast<uint8_t*>(std::aligned_alloc(4096, round_up(bytes)))) {
    if (!p_) throw ConfigError("--mib", str("cannot allocate ", bytes >> 20, " MiB; use less"));
  }
  ~Buffer() { std::free(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() { return p_; }
  size_t size() const { return bytes_; }
  // Pseudo-random bytes (splitmix64): coding cost does not depend on the values, but a
  // rebuild checked against them must not pass by accident on zeros.
  void fill(uint64_t seed) {
    uint64_t x = seed;
    for (size_t i = 0; i + 8 <= bytes_; i += 8) {
      uint64_t z = (x += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      std::memcpy(p_ + i, &z, 8);
    }
    for (size_t i = bytes_ & ~size_t(7); i < bytes_; ++i) p_[i] = uint8_t(seed + i);
  }

 private:
  static size_t round_up(size_t n) { return std::max<size_t>(4096, (n + 4095) & ~size_t(4095)); }
  size_t bytes_;
  uint8_t* p_;
};

template <typename F>
double median_seconds(F&& f) {
  double t[kReps];
  for (double& s : t) {
    auto t0 = Clock::now();
    f();
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::sort(t, t + kReps);
  return t[kReps / 2];
}

// The fastest of kBestOf: what the machine does when nothing else takes the core or the
// memory bus (a bound, which other load on a shared machine only ever makes slower).
constexpr int kBestOf = 7;
template <typename F>
double best_seconds(F&& f) {
  double best = 1e300;
  for (int i = 0; i < kBestOf; ++i) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

struct Row {
  std::string what;
  double bytes = 0, secs = 0;
};

void print_rows(const std::vector<Row>& rows, double memcpy_bps) {
  std::printf("%-44s %9s %9s %8s %9s\n", "what", "MiB", "ms", "GB/s", "x memcpy");
  for (const Row& r : rows) {
    const double bps = r.bytes / r.secs;
    std::printf("%-44s %9.1f %9.2f %8.2f %9.2f\n", r.what.c_str(), r.bytes / double(1 << 20),
                r.secs * 1e3, bps / 1e9, bps / memcpy_bps);
  }
}

// ---- Part: encode ----

// Encode and rebuild of one (k, m) stripe of `len`-byte fragments: two rows (GB/s are data
// bytes of the stripe, k * len, per second, so the two compare with each other and memcpy).
void measure_code(int k, int m, size_t len, std::vector<Row>& rows, double& encode_bps) {
  progress(str("k=", k, " m=", m, ": filling ", (k + m) * (len >> 20), " MiB"));
  checkpoint::ErasureCode ec(k, m);
  std::vector<std::unique_ptr<Buffer>> frags;
  std::vector<const uint8_t*> data;
  std::vector<uint8_t*> parity, all;
  for (int i = 0; i < k + m; ++i) {
    frags.push_back(std::make_unique<Buffer>(len));
    frags.back()->fill(uint64_t(i + 1));  // parity too: touched before it is timed
    all.push_back(frags.back()->data());
    if (i < k)
      data.push_back(all.back());
    else
      parity.push_back(all.back());
  }
  progress(str("k=", k, " m=", m, ": encode x", kReps));
  const double enc = median_seconds([&] { ec.encode(data, parity, len); });
  const double stripe = double(k) * double(len);
  rows.push_back({str("encode k=", k, " m=", m, " (data bytes)"), stripe, enc});
  encode_bps = std::min(encode_bps, stripe / enc);

  // Lose data fragment 0 and rebuild it from the k survivors; check the bytes came back.
  const uint32_t want = checkpoint::crc32c(all[0], len);
  std::memset(all[0], 0xA5, len);
  progress(str("k=", k, " m=", m, ": rebuild data fragment 0 x", kReps));
  const double rec = median_seconds([&] { ec.reconstruct(all, {0}, len); });
  if (checkpoint::crc32c(all[0], len) != want)
    throw InternalError(str("bench snapshot: k=", k, " m=", m, " rebuilt fragment 0 wrongly"));
  rows.push_back({str("rebuild 1 lost data fragment k=", k, " m=", m), stripe, rec});
}

void run_encode(const Options& o) {
  const size_t len = size_t(o.mib) << 20;
  checkpoint::ErasureCode probe(2, 1);  // built without ISA-L: NotSupported before any work
  std::vector<Row> rows;

  double cpy = 0;
  {  // freed before the stripes are filled: at most 6 buffers live at once
    progress(str("memcpy and crc32c: filling 2 x ", o.mib, " MiB"));
    Buffer src(len), dst(len);
    src.fill(99);
    dst.fill(98);  // touched: a snapshot slot is written every interval, never fresh
    cpy = median_seconds([&] { std::memcpy(dst.data(), src.data(), len); });
    rows.push_back({"memcpy into touched memory", double(len), cpy});
    const double crc = median_seconds([&] { g_sink = checkpoint::crc32c(src.data(), len); });
    rows.push_back({"crc32c", double(len), crc});
  }

  double encode_bps = 1e300;
  measure_code(2, 1, len, rows, encode_bps);
  measure_code(4, 2, len, rows, encode_bps);

  std::printf("== encode: %lld MiB per fragment, one thread, median of %d\n", (long long)o.mib,
              kReps);
  print_rows(rows, double(len) / cpy);
  std::printf("target: encode >= %.0f GB/s per core: %s (slowest %.2f GB/s)\n",
              kEncodeTargetBps / 1e9, encode_bps >= kEncodeTargetBps ? "met" : "NOT met",
              encode_bps / 1e9);
  std::printf("\n");
  std::fflush(stdout);
}

// Every part a user can name, in the order they run.
struct Part {
  const char* name;
  void (*run)(const Options&);
};
const Part kParts[] = {
    {"encode", run_encode},
    {"overhead", run_overhead},
    {"recovery", run_recovery},
    {"node-loss", run_node_loss}};

std::string part_names() {
  std::string s;
  for (const Part& p : kParts) s += std::string(s.empty() ? "" : ",") + p.name;
  return s;
}

// Removes a segment however the measurement ends.
struct SegmentName {
  std::string name;
  ~SegmentName() { checkpoint::SnapshotSegment::unlink(name); }
};

}  // namespace

CopyRates measure_copy_rates(int64_t bytes) {
  CopyRates r;
  r.bytes = bytes;
  progress(str("copy rates: filling 2 x ", bytes >> 20, " MiB and a segment of two slots"));
  Buffer dst{size_t(bytes)};
  dst.fill(98);
  core::Tensor src = core::Tensor::empty({bytes}, core::DType::kU8);
  std::memset(src.raw_data(), 0x5A, size_t(bytes));  // touched; the values do not matter
  r.memcpy_bps =
      double(bytes) / best_seconds([&] { std::memcpy(dst.data(), src.raw_data(), size_t(bytes)); });
  // A segment of this process (the agent creates them in a job; the writer cannot tell).
  SegmentName seg{checkpoint::segment_name("00000000b5e7c4a1", checkpoint::SegmentKind::kData, 0, 0,
                                           int(::getpid()))};
  checkpoint::SnapshotSegment::unlink(seg.name);  // a leftover of a killed run of this pid
  checkpoint::SnapshotWriter writer(
      checkpoint::SnapshotSegment::create(seg.name, bytes, int(::getpid())));
  checkpoint::SnapshotMeta meta;
  meta.job_id = "00000000b5e7c4a1";
  meta.rank = 0;
  meta.world = 1;
  auto snapshot = [&] {
    meta.step++;
    writer.start(meta, {src});
    writer.wait();
  };
  snapshot();  // both slots written once: the steady state of a job's snapshots
  snapshot();
  r.writer_bps = double(bytes) / best_seconds(snapshot);
  std::optional<checkpoint::SnapshotSegment::View> v = writer.segment().latest();
  WEFT_CHECK(v.has_value(), "bench snapshot: nothing committed in ", seg.name);
  r.verify_bps = double(bytes) / best_seconds([&] {
                   if (!writer.segment().corrupt_blocks(*v).empty())
                     throw InternalError("bench snapshot: " + seg.name + " reads back corrupt");
                 });
  return r;
}

}  // namespace weft::launch::snapbench

namespace weft::launch {

int bench_snapshot(const std::vector<std::string>& args) {
  using namespace snapbench;
  Args a(args,
         {"--parts", "--mib", "--configs", "--ranks", "--steps", "--rounds", "--copies", "--every",
          "--set", "--timeout", "--dir"},
         {"--warm-checkpoint", "--keep"});
  Options o;
  o.mib = a.get_int("--mib", kDefaultMib);
  if (o.mib < 1 || o.mib > (int64_t(1) << 20))
    throw ConfigError("--mib", str("MiB per fragment must be in [1, 1048576], got ", o.mib));
  std::vector<const Part*> parts;
  std::stringstream ss(a.get_or("--parts", part_names()));
  for (std::string name; std::getline(ss, name, ',');) {
    const Part* found = nullptr;
    for (const Part& p : kParts)
      if (name == p.name) found = &p;
    if (!found)
      throw ConfigError("--parts",
                        "unknown part '" + name + "'; expected some of: " + part_names());
    if (std::find(parts.begin(), parts.end(), found) == parts.end()) parts.push_back(found);
  }
  if (parts.empty())
    throw ConfigError("--parts", "no part named; expected some of: " + part_names());
  if (a.has("--configs")) {
    o.configs.clear();
    std::stringstream cs(a.get("--configs"));
    for (std::string c; std::getline(cs, c, ',');) {
      if (c != "S") try {
          bench::parse_count(c);
        } catch (const ConfigError&) {
          throw ConfigError("--configs", "'" + c +
                                             "': expected S or a parameter count such as "
                                             "350M, 40M or 2.5e8 (the ~350M job scaled to it)");
        }
      o.configs.push_back(c);
    }
    if (o.configs.empty())
      throw ConfigError("--configs", "no config named; expected S and/or a count such as 350M");
  }
  o.ranks = int(a.get_int("--ranks", 0));
  if (o.ranks < 0 || o.ranks > 8)
    throw ConfigError("--ranks", str("expected 1 to 8, got ", o.ranks));
  o.steps = int(a.get_int("--steps", o.steps));
  if (o.steps < 2 || o.steps > 100000)
    throw ConfigError("--steps", str("expected 2 to 100000 counted steps, got ", o.steps));
  o.rounds = int(a.get_int("--rounds", o.rounds));
  if (o.rounds < 1 || o.rounds > o.steps)
    throw ConfigError("--rounds", str("expected 1 to --steps (", o.steps, "), got ", o.rounds));
  o.copies = int(a.get_int("--copies", o.copies));
  if (o.copies < 1 || o.copies > 1000)
    throw ConfigError("--copies", str("expected 1 to 1000 counted snapshots, got ", o.copies));
  o.every = int(a.get_int("--every", 0));
  if (o.every < 0 || o.every > 100000)
    throw ConfigError("--every", str("expected an interval of 1 to 100000 steps (0: choose it "
                                     "from the measurement), got ",
                                     o.every));
  o.sets = a.all("--set");
  o.timeout = bench::seconds_option(a, "--timeout", o.timeout);
  o.warm_checkpoint = a.flag("--warm-checkpoint");
  o.keep = a.flag("--keep");
  const bool trains = std::any_of(parts.begin(), parts.end(),
                                  [](const Part* p) { return std::string(p->name) != "encode"; });
  if (trains) {
    // Every job is sized before the first one runs: a refusal leaves nothing behind.
    for (const std::string& c : o.configs)
      for (const Part* p : parts) {
        const std::string n = p->name;
        if (n == "node-loss") make_node_shape(c, o);
        else if (n != "encode") make_shape(c, o, n == "recovery");
      }
    if (a.has("--dir")) {
      o.dir = a.get("--dir");
      fs::create_directories(o.dir);
    } else {
      std::string t = (fs::temp_directory_path() / "weft_bench_snapshot_XXXXXX").string();
      if (!::mkdtemp(t.data())) throw IoError("weft bench snapshot: cannot create " + t);
      o.dir = t;
      o.own_dir = true;
    }
  }
  int code = 0;
  for (const Part& p : kParts) {  // the table's order, whatever order they were named in
    if (std::find(parts.begin(), parts.end(), &p) == parts.end()) continue;
    try {
      p.run(o);
    } catch (const NotSupported& e) {  // no ISA-L: named, it is an error; by default, skipped
      if (a.has("--parts")) throw;
      std::printf("%s: skipped: %s\n\n", p.name, e.what());
    } catch (const IoError& e) {  // a job that failed: the others still run
      std::printf("%s: FAILED: %s\n\n", p.name, e.what());
      std::fflush(stdout);
      code = 1;
    }
  }
  if (trains && o.own_dir && !o.keep && code == 0) {
    std::error_code ec;
    fs::remove_all(o.dir, ec);
  } else if (trains) {
    std::printf("job folders (weft run's output with arrival stamps, metrics) kept in %s\n",
                o.dir.c_str());
  }
  return code;
}

}  // namespace weft::launch
