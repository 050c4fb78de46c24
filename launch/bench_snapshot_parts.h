// The parts of `weft bench snapshot` (launch/bench_snapshot.h) and what they share: the
// options, single-thread copy rates measured in the bench's own process, and the training
// jobs (config S, the ~350M state) under `weft run --standalone`: their output stamped on
// arrival, their workers' CPU time sampled, their snapshot segments removed however they
// end.
//   bench_snapshot.cc           options, the encode part, dispatch
//   bench_snapshot_jobs.cc      the jobs: config S and the ~350M state, sizing, launching
//   bench_snapshot_overhead.cc  per-step cost of snapshot.every 0 / 1 / K
//   bench_snapshot_recovery.cc  SIGKILL of a worker: snapshots against a disk checkpoint
//   bench_snapshot_node_loss.cc a node lost whole: survivors live on snapshots against a
//                               checkpoint-restart
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/job_spec.h"
#include "launch/bench_util.h"
#include "launch/bench_elastic_agent.h"

namespace weft::launch::snapbench {

namespace fs = std::filesystem;

struct Options {
  int64_t mib = 256;                                 // encode: per fragment; copy rates: per copy
  std::vector<std::string> configs = {"S", "350M"};  // "S" or a parameter count
  int ranks = 0;                  // 0: per config (S: 2; the big state: what fits)
  int steps = 30;                 // overhead: counted steps per variant
  int rounds = 2;                 // overhead: every 0 and 1 alternate in rounds
  int copies = 3;                 // overhead at every K: counted snapshot steps
  int every = 0;                  // overhead: the interval to confirm; 0: choose
  std::vector<std::string> sets;  // to every job's weft train, last
  double timeout = 3600;          // per job, seconds
  bool warm_checkpoint = false;   // recovery: keep the checkpoint's page cache
  fs::path dir;                   // scratch: one folder per job
  bool own_dir = false, keep = false;
};

void progress(const std::string& what);  // "[bench snapshot] what" on stderr
// "load average 1.23 0.98 0.80" (/proc/loadavg), for the setup lines of a timing.
std::string load_average();

// Single-thread rates (bytes per second) in this process, `bytes` per copy, best of 7:
// memcpy into already-touched memory, and the snapshot writer's copy (memcpy and a crc32c
// per 1 MiB block, checkpoint::SnapshotWriter) into a slot of a real shared-memory segment
// whose both slots were written before (a steady snapshot), and a check of a whole slot in
// place (crc32c of every block: SnapshotSegment::corrupt_blocks), as `weft snapshot verify`
// and the agent's parity repair make it (a restart checks a slot in the pass that copies it
// out instead: checkpoint/snapshot_offers.h).
struct CopyRates {
  double memcpy_bps = 0, writer_bps = 0, verify_bps = 0;
  int64_t bytes = 0;
};
CopyRates measure_copy_rates(int64_t bytes);

// One training job of the bench: a config's shape, sized for this machine.
struct JobShape {
  std::string name;               // "S", or the count asked for ("350M")
  std::string config;             // weft train's YAML
  std::vector<std::string> sets;  // the shape's settings (then the bench's, then the user's)
  std::vector<std::string> layout_sets;  // after the bench's: node-loss's ZeRO-3 over dp auto
  int ranks = 1, threads = 1;
  core::JobSpec spec;  // as the workers load it (out_dir and steps aside)
  double params = 0;
  int64_t payload = 0;           // snapshot bytes of the largest rank (two slots of it per rank)
  std::string describe() const;  // "gpt 4 x 256, seq 256, ...: 3.29M parameters; 2 ranks ..."
};
// The job of `name` ("S" or a count such as 350M) for `o`; ConfigError naming --configs or
// --ranks when it cannot run here (the batch does not divide, memory). `recovery`: a restart
// holds a read copy of each rank's snapshot beside the slots while it restores.
JobShape make_shape(const std::string& name, const Options& o, bool recovery);
// The node-loss part's job of `name`: three nodes of one rank, ZeRO-3 over dp 3 (each shard
// exists once), a global batch dp 3 and dp 2 divide; the ~350M state scaled down (said in
// `note`) until three workers, their snapshot slots, replicas and parity fit in memory.
JobShape make_node_shape(const std::string& name, const Options& o, std::string* note = nullptr);

// weft train's settings of a job, in order: the shape's, the bench's, the shape's layout, its
// out_dir, the run's own `sets`, the user's --set.
std::vector<std::string> job_sets(const Options& o, const JobShape& shape, const fs::path& out_dir,
                                  const std::vector<std::string>& sets);
// Removes the snapshot segments and agent lock files of the job `weft run --rdzv-id rdzv_id`
// started (its agents gone, or going: `ended` false waits up to 5 s for their locks).
void remove_job_segments(const std::string& rdzv_id, bool ended);
// Drops a file's pages from the page cache (written back first: DONTNEED leaves dirty ones).
void drop_cache(const fs::path& p);
// The share of a folder's file pages in the page cache (mincore), -1 when unknown.
double cached_share(const fs::path& dir);

// One `weft run --standalone` of a job (weft run's output and its workers', one pipe,
// stamped on arrival: launch/bench_elastic_agent.h), in its own folder under o.dir.
class JobRun {
 public:
  using Clock = BenchAgent::Clock;
  // `sets`: beyond the shape's and before the user's; `max_restarts` to weft run.
  JobRun(const Options& o, const JobShape& shape, const std::string& label,
         const std::vector<std::string>& sets, int max_restarts);
  ~JobRun();  // SIGKILLs what still runs; removes the job's snapshot segments
  JobRun(const JobRun&) = delete;
  JobRun& operator=(const JobRun&) = delete;

  const std::string& label() const { return label_; }
  const fs::path& folder() const { return folder_; }
  fs::path metrics() const { return folder_ / "run" / "metrics.jsonl"; }
  const std::vector<StampedLine>& lines() const { return agent_->lines(); }
  double now() const;  // seconds on the lines' clock
  bool running() const { return agent_->running(); }
  int exit_code() const { return agent_->exit_code(); }
  // Waits up to `ms` for output and reads it.
  void pump(int ms);
  // Pumps until `done` holds (true), the job ends or --timeout passes (false); `on_line` sees
  // every line once, in order, as it arrives.
  bool watch(const std::function<void(const StampedLine&)>& on_line,
             const std::function<bool()>& done);
  // The workers (weft run's children with a rank): rank -> pid, empty before they start.
  std::vector<std::pair<int, pid_t>> workers() const;
  // CPU seconds of the workers alive now: every thread's, those that ended included (their
  // CPU clocks, nanoseconds; /proc's clock ticks where a clock cannot be read).
  double workers_cpu_s() const;
  // The last lines of the output, for a failure's message.
  std::string tail(size_t n = 15) const;

 private:
  const Options& o_;
  std::string label_, rdzv_id_;
  fs::path folder_;
  double timeout_;
  Clock::time_point origin_;
  std::unique_ptr<BenchAgent> agent_;
  size_t seen_ = 0;
};

// The step of "[rank 0] step     3/40 | loss ...", or -1.
long long step_line(const std::string& s);
using launch::median;  // launch/bench_util.h

void run_overhead(const Options& o);
void run_recovery(const Options& o);
void run_node_loss(const Options& o);

}  // namespace weft::launch::snapbench
